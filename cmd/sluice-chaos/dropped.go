package main

import (
	"regexp"
	"slices"
	"strings"
	"time"
)

// A copy the broker confirmed is the broker's to keep: Sluice's part of an
// event ends there. In cluster-node-kill, RabbitMQ 3.10.8 has lost such
// copies after a queue's leader was SIGKILLed and restarted (docs/
// reliability.md, "The broker's losses"): the scenario's check then failed
// on the broker, not on Sluice. dropped tells those events apart, from the
// consumers' traces, so that the check holds Sluice to everything else
// and reports the broker's losses on their own.

// traceClock is the trace lines' clock: the time of day, to the
// millisecond (the consumers' and the harness's).
const traceClock = "15:04:05.000"

// traceLine is a consumer's trace line as the harness keeps it: "process N:
// HH:MM:SS.mmm what".
var traceLine = regexp.MustCompile(`^process \d+: (\d\d:\d\d:\d\d\.\d\d\d) (.*)$`)

// confirmedLine is a tracingPublisher's line of a copy the broker confirmed:
// its queue and when its publish began.
var confirmedLine = regexp.MustCompile(`^(?:poison|retry) copy published to (\S+) \(sent (\d\d:\d\d:\d\d\.\d\d\d)\): <nil>$`)

// lossRule says which copies the broker may have lost: copies confirmed into
// a queue only the broker drains, before the node that led it at a kill was
// back in every queue.
type lossRule struct {
	// start is the run's start: a trace's time of day is read on its date,
	// or the next day's when it comes before it (a run that passes
	// midnight).
	start time.Time
	kills []*nodeKill
}

// dropped returns, of the events ids (missing at the end: valid ones
// without an effect, bad ones not in the poison queue), those the broker
// dropped: an event whose consumers' trace has a copy published to one of
// the queues held and confirmed (the publisher's answer nil), before a
// node that led that queue at its kill was back in every queue, and no
// delivery of it from the moment that publish began. An event whose trace
// was cut (traceLinesPerEvent) never is: its last lines are not known.
// The ids keep their order.
func (r lossRule) dropped(ids, held []string, trace func(id string) []string) []string {
	var dropped []string
	for _, id := range ids {
		lines := trace(id)
		if len(lines) >= traceLinesPerEvent {
			continue
		}
		var sent, delivered time.Time // the latest
		var queue string
		for _, l := range lines {
			m := traceLine.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			if strings.HasPrefix(m[2], "delivered ") {
				if at, ok := r.clock(m[1]); ok && at.After(delivered) {
					delivered = at
				}
				continue
			}
			c := confirmedLine.FindStringSubmatch(m[2])
			if c == nil || !slices.Contains(held, c[1]) {
				continue
			}
			if at, ok := r.clock(c[2]); ok && at.After(sent) {
				sent, queue = at, c[1]
			}
		}
		if !sent.IsZero() && delivered.Before(sent) && r.killed(queue, sent) {
			dropped = append(dropped, id)
		}
	}
	return dropped
}

// killed reports whether a node that led queue at its kill came back in
// every queue after at (or has not yet): a copy confirmed at at was in
// the queue, or sent to it, while its leader was down or catching up.
func (r lossRule) killed(queue string, at time.Time) bool {
	for _, k := range r.kills {
		if slices.Contains(k.queues, queue) && (k.online.IsZero() || at.Before(k.online)) {
			return true
		}
	}
	return false
}

// clock reads a trace's time of day on the run's date.
func (r lossRule) clock(s string) (time.Time, bool) {
	t, err := time.ParseInLocation(traceClock, s, r.start.Location())
	if err != nil {
		return time.Time{}, false
	}
	y, mo, d := r.start.Date()
	t = time.Date(y, mo, d, t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), r.start.Location())
	if t.Before(r.start.Add(-time.Minute)) {
		t = t.AddDate(0, 0, 1)
	}
	return t, true
}

// droppedStable is how long settle waits, with every event accounted for
// but some dropped, before it takes the run as settled: a copy on its way
// back from a tier is in no queue's ready count while a dead-letter worker
// holds it, and the worker sends an unconfirmed copy again only after the
// nodes' dead_letter_worker_publisher_confirm_timeout (-dlx-confirm-timeout;
// RabbitMQ's is 180 s).
func (w *world) droppedStable() time.Duration {
	resend := w.o.dlxConfirmTimeout
	if resend <= 0 {
		resend = 180 * time.Second
	}
	return 30*time.Second + 2*resend
}

// droppedValid and droppedBad are the events of ids the broker dropped
// (lossRule), for valid and for bad events; nil outside cluster-node-kill.
func (w *world) droppedValid(ids []string) []string { return w.droppedOf(ids, false) }
func (w *world) droppedBad(ids []string) []string   { return w.droppedOf(ids, true) }

func (w *world) droppedOf(ids []string, bad bool) []string {
	if w.cl == nil || len(ids) == 0 {
		return nil
	}
	held := w.brokerDrained()
	var queues []string // the tiers, and for a bad event the poison queue
	for _, t := range w.topo.Tiers() {
		if held[t.Topic] {
			queues = append(queues, t.Topic)
		}
	}
	if q := w.topo.Config().PoisonQueue; bad && held[q] {
		queues = append(queues, q)
	}
	return lossRule{start: w.start, kills: w.cl.kills}.dropped(ids, queues, w.traces.of)
}

// brokerDrained returns the scenario's queues that the broker declares as
// Sluice's topology must for a copy in them to be the broker's to keep:
// the tiers as quorum queues that dead-letter at least once and refuse a
// publish when full (not at most once, which drops a copy when a leader
// dies: that would be Sluice's topology's mistake), the poison queue as a
// quorum queue. Read once from a node (rabbitmqctl list_queues name
// arguments); none when no node answers.
func (w *world) brokerDrained() map[string]bool {
	if w.cl.drained != nil {
		return w.cl.drained
	}
	held, tiers := map[string]bool{}, map[string]bool{}
	for _, t := range w.topo.Tiers() {
		tiers[t.Topic] = true
	}
	for i := range w.cl.c.Nodes {
		out, err := w.cl.c.TryCtl(i, "list_queues", "--no-table-headers", "name", "arguments")
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(out, "\n") {
			name, args, _ := strings.Cut(strings.TrimSpace(line), "\t")
			quorum := strings.Contains(args, `{"x-queue-type","quorum"}`)
			switch {
			case tiers[name]:
				held[name] = quorum && strings.Contains(args, `{"x-dead-letter-strategy","at-least-once"}`) &&
					strings.Contains(args, `{"x-overflow","reject-publish"}`)
			case name == w.topo.Config().PoisonQueue:
				held[name] = quorum
			}
		}
		w.cl.drained = held
		return held
	}
	return held
}
