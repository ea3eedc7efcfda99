package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
)

// settleStable is how long settle's condition must hold before the
// consumers are stopped. The queue depths count ready messages only: a
// delivery still in a handler (unacked), or its retry copy on its way to a
// tier, is in no count. Taken as settled at that moment, the consumers'
// stop sent the delivery back, or the copy came back from its tier to no
// consumer: a message left at the end though nothing was lost — a
// duplicate copy of an event done meanwhile that failed (its batch's
// claim held by the copy that did it). Held 1 s, such work has ended or
// shows: its copy is in a tier queue.
const settleStable = time.Second

// settle waits until every valid event has its effect, every bad one is in
// a poison queue, and the main and tier queues are empty, for settleStable,
// once disrupted is closed: the disruption over (in cluster-node-kill, the
// last node killed back in every queue). Settled before, a run was
// verified after the node it had killed rejoined its queues, and the
// poison queue that node had led, which had held all 9 bad events while
// settle looked, held none.
func (w *world) settle(ctx context.Context, p plan, disrupted <-chan struct{}) error {
	var last string
	var since time.Time // when the condition began to hold
	for {
		effects, poisoned, depth, err := w.observe(ctx)
		if err == nil {
			last = fmt.Sprintf("%d/%d effects, %d/%d poisoned, %d in the main and tier queues", len(effects), len(p.valid), len(poisoned), len(p.bad), depth)
			settled, more := w.settledOutbox(ctx, p)
			last += more
			over := false
			select {
			case <-disrupted:
				over = true
			default:
				last += " (the disruption under way)"
			}
			// Events the broker dropped (dropped.go) count as accounted
			// for, once no copy of them has come back for droppedStable.
			stable, droppedValid, droppedBad := settleStable, w.droppedValid(absent(p.valid, effects)), w.droppedBad(absent(p.bad, poisoned))
			if n := len(droppedValid) + len(droppedBad); n > 0 {
				stable = w.droppedStable()
				last += fmt.Sprintf(", %d dropped by the broker", n)
			}
			switch {
			case len(effects)+len(droppedValid) < len(p.valid) || len(poisoned)+len(droppedBad) < len(p.bad) || depth > 0 || !settled || !over:
				since = time.Time{}
			case since.IsZero():
				since = time.Now()
			case time.Since(since) >= stable:
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("did not settle: %s (last error: %w)", last, errors.Join(err, ctx.Err()))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// observe reads the effects (event id → rows), the poisoned event ids
// (→ copies) and the depth of the main and tier queues.
func (w *world) observe(ctx context.Context) (map[string]int, map[string]int, int, error) {
	effects := map[string]int{}
	rows, err := w.db.QueryContext(ctx, "SELECT event_id, count(*) FROM "+w.name+".effects GROUP BY event_id")
	if err != nil {
		return nil, nil, 0, err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			_ = rows.Close()
			return nil, nil, 0, err
		}
		effects[id] = n
	}
	_ = rows.Close()
	poisoned := map[string]int{}
	depth := 0
	w.queueMu.Lock()
	defer w.queueMu.Unlock()
	err = w.withConn(func(c *amqp.Connection) error {
		if err := w.readPoisoned(ctx, c, poisoned); err != nil {
			return err
		}
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		for _, q := range w.queues(false) {
			info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				return err
			}
			depth += info.Messages
		}
		return nil
	})
	return effects, poisoned, depth, err
}

// readPoisoned counts the poison queue's copies per event id into poisoned:
// with dlq's Inspect, or on a cluster by reading to the end (readQueue),
// which depends on no count: right after a node's kill a passive declare
// may count a quorum queue 0 (dlq's scan then takes the count from its
// first basic.get), and the harness's tally trusts the queue's end alone.
func (w *world) readPoisoned(ctx context.Context, c *amqp.Connection, poisoned map[string]int) error {
	if w.cl != nil {
		return readQueue(c, w.topo.Config().PoisonQueue, func(d amqp.Delivery) {
			if d.Headers[fillerKey] == nil {
				id, _ := d.Headers[chaosIDKey].(string)
				poisoned[id]++
			}
		})
	}
	ms, err := dlq.Open(c, w.topo.Config().PoisonQueue, dlq.Config{}).Inspect(ctx, dlq.Filter{}, 0)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.Msg.Metadata.Get(fillerKey) == "" {
			poisoned[m.Msg.Metadata.Get(chaosIDKey)]++
		}
	}
	return nil
}

// readQueue reads every message of queue with basic.get, to the end, and
// gives them back by closing its channel (the broker puts them back
// after: a read right after may miss some, which only delays settle —
// nothing takes from a cluster scenario's poison queue, so its count only
// grows). It does not go by the count a
// passive declare gives: RabbitMQ 3.10's is 0 for a quorum queue whose
// leader does not answer within 250 ms or is not the one the queue's
// record names (rabbit_quorum_queue:stat/2), which a loaded cluster whose
// node was just killed gives — a poison queue holding its 9 copies read
// as empty. Bounded (readQueueMax).
func readQueue(c *amqp.Connection, queue string, fn func(amqp.Delivery)) error {
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }() // gives back what was read
	for range readQueueMax {
		d, ok, err := ch.Get(queue, false)
		if err != nil || !ok {
			return err
		}
		fn(d)
	}
	return fmt.Errorf("%s holds more than %d messages", queue, readQueueMax)
}

// readQueueMax bounds readQueue: a scenario's plan has 20,000 events at
// most (make chaos).
const readQueueMax = 100_000

// traced is what a problem about event id adds: its consumers' trace lines
// (and the harness's, with harness), or "" when none traced it.
func (w *world) traced(id string, harness bool) string {
	lines := w.traces.of(id)
	if len(lines) == 0 {
		return ""
	}
	if harness {
		lines = append(lines, w.traces.of(harnessTrace)...)
	}
	return ", its consumers' traces:\n    " + strings.Join(lines, "\n    ")
}

// absent returns the ids of want that have has[id] == 0, sorted.
func absent(want map[string]bool, has map[string]int) []string {
	var ids []string
	for id := range want {
		if has[id] == 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// verify compares the final state with the plan, exactly.
func (w *world) verify(p plan) (string, error) {
	effects, poisoned, depth, err := w.observe(context.Background())
	if err != nil {
		return "observe", err
	}
	// The consumers are stopped: the main and tier queues are counted by
	// reading them too, which a passive declare's 0 (readQueue) cannot fool.
	if w.cl != nil {
		n, err := w.readDepth()
		if err != nil {
			return "observe", err
		}
		depth = max(depth, n)
	}
	// What the broker dropped after confirming it is the broker's loss,
	// reported apart (dropped.go); Sluice is held to the rest.
	dropped := slices.Concat(w.droppedValid(absent(p.valid, effects)), w.droppedBad(absent(p.bad, poisoned)))
	twice, all := exactlyOnce(effects, p.valid, "unexpected effect ", "missing effect ")
	var problems []string
	for _, pr := range all {
		id, missing := strings.CutPrefix(pr, "missing effect ")
		switch {
		case missing && slices.Contains(dropped, id):
		case missing:
			problems = append(problems, pr+w.traced(id, true))
		default:
			problems = append(problems, pr)
		}
	}
	copies := 0
	for id, n := range poisoned {
		copies += n
		if !p.bad[id] {
			problems = append(problems, "valid event poisoned "+id)
		}
	}
	for _, id := range absent(p.bad, poisoned) {
		if !slices.Contains(dropped, id) {
			problems = append(problems, "bad event not in the poison queue "+id+w.traced(id, false))
		}
	}
	if twice > 0 {
		problems = append(problems, fmt.Sprintf("%d events with a double effect", twice))
	}
	if depth > 0 {
		problems = append(problems, fmt.Sprintf("%d messages left in the main and tier queues: %s", depth, w.leftovers(effects)))
	}
	res := fmt.Sprintf("effects %d == %d valid, %d twice; poison %d == %d bad (%d copies); queues empty: %v",
		len(effects), len(p.valid), twice, len(poisoned), len(p.bad), copies, depth == 0)
	if len(dropped) > 0 {
		slices.Sort(dropped)
		res += fmt.Sprintf("; BROKER LOSS: %d events' copies confirmed by the broker into the poison queue or a tier and not given back (%s), not counted against Sluice (docs/reliability.md, \"The broker's losses\")",
			len(dropped), strings.Join(dropped, ", "))
		for _, id := range dropped {
			fmt.Printf("  digest: dropped by the broker: %s%s\n", id, w.traced(id, false))
		}
	}
	more, outboxProblems := w.verifyOutbox(p)
	res, problems = res+more, append(problems, outboxProblems...)
	if len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > 10 {
			problems = append(problems[:10], fmt.Sprintf("… %d more", len(problems)-10))
		}
		return res, errors.New(strings.Join(problems, "; "))
	}
	return res, nil
}

// readDepth counts the messages of the main and tier queues by reading them
// (readQueue).
func (w *world) readDepth() (int, error) {
	n := 0
	w.queueMu.Lock()
	defer w.queueMu.Unlock()
	err := w.withConn(func(c *amqp.Connection) error {
		for _, q := range w.queues(false) {
			if err := readQueue(c, q, func(amqp.Delivery) { n++ }); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// leftovers names the messages left in the main and tier queues: the queue,
// the event, its attempt, whether it has its effect — for a scenario that
// fails with messages left.
func (w *world) leftovers(effects map[string]int) string {
	var out []string
	w.queueMu.Lock()
	defer w.queueMu.Unlock()
	err := w.withConn(func(c *amqp.Connection) error {
		for _, q := range w.queues(false) {
			ms, err := dlq.Open(c, q, dlq.Config{}).Inspect(context.Background(), dlq.Filter{}, 20)
			if err != nil {
				return err
			}
			for _, m := range ms {
				id := m.Msg.Metadata.Get(chaosIDKey)
				out = append(out, fmt.Sprintf("%s in %s (attempt %q, redelivered %v, effects %d)", id, q,
					m.Msg.Metadata.Get(sluice.AttemptKey), m.Delivery.Redelivered, effects[id]))
				if lines := w.traces.of(id); len(lines) > 0 {
					out = append(out, "its consumers' traces:\n    "+strings.Join(append(lines, w.traces.of(harnessTrace)...), "\n    "))
				}
			}
		}
		return nil
	})
	if err != nil {
		out = append(out, "(reading them: "+err.Error()+")")
	}
	return strings.Join(out, ", ")
}
