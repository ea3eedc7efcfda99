package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
)

// outboxCrashPoints are the consumers' self-crashes in the outbox scenario:
// the effects handler's (before its commit; after it, its produced message
// committed and not relayed), the relay's (half a batch confirmed; all of
// it confirmed, its rows not deleted) and the receiver's.
var outboxCrashPoints = []string{"before-commit", "after-commit", "after-tier-publish", "relay-mid-batch", "relay-after-publish",
	"receiver-before-commit", "receiver-after-commit"}

// relayCrashFactor multiplies -crash-prob at the relay's crash points: a
// relay has far fewer batches than its consumer has deliveries.
const relayCrashFactor = 5

// directBatch is how many rows the harness writes into the outbox in one
// transaction while the broker is down.
const directBatch = 50

// outboxWorld is the outbox scenario's part of a world: the queue the
// consumers produce to through their outbox (consumed by their receiver,
// with its own inbox and business table), and what the harness writes into
// the outbox itself while the broker is down, as a service that produces
// without consuming does.
type outboxWorld struct {
	topo  *rabbitmq.Topology // the produced queue, the receiver's
	store *sluicesql.Outbox
	// Measured during the outage.
	at       int           // effects when the broker was stopped
	down     time.Duration // from stop_app's return until the broker served again
	pending  int           // rows in the outbox when the broker returned
	relayed  time.Duration // from then until each of them was relayed
	recovery time.Duration // until every row written during the outage was received
}

// setupOutbox adds the receiver's tables and queues and the outbox table,
// and makes the consumers produce.
func (w *world) setupOutbox(ctx context.Context) error {
	ob := &outboxWorld{}
	if _, err := w.db.ExecContext(ctx, "CREATE TABLE "+w.name+".received (event_id TEXT NOT NULL)"); err != nil {
		return err
	}
	inbox, err := sluicesql.NewInbox(w.db, sluicesql.InboxConfig{Table: w.name + ".receiver_inbox"})
	if err != nil {
		return err
	}
	if err := inbox.CreateTable(ctx); err != nil {
		return err
	}
	stores, err := sluicesql.New(w.db, sluicesql.Config{Schema: w.name, Outbox: sluicesql.OutboxConfig{Table: "outbox"}})
	if err != nil {
		return err
	}
	if err := stores.Migrate(ctx); err != nil {
		return err
	}
	ob.store = stores.Outbox
	delays, err := parseDelays(w.o.tiers)
	if err != nil {
		return err
	}
	if ob.topo, err = rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: w.name + "_produced", TierDelays: delays, Quorum: w.quorum}); err != nil {
		return err
	}
	w.ob = ob // teardown deletes its queues
	if err := w.withConn(func(c *amqp.Connection) error {
		_, err := ob.topo.Declare(ctx, c)
		return err
	}); err != nil {
		return err
	}
	w.slotArgs = []string{"--produce-to", ob.topo.Config().Queue, "--crash-points", strings.Join(outboxCrashPoints, ","),
		"--relay-crash-prob", fmt.Sprint(min(relayCrashFactor*w.o.crashProb, 0.5))}
	return nil
}

// queues returns the receiver's main and tier queues, and with all its
// poison queue.
func (ob *outboxWorld) queues(all bool) []string {
	if ob == nil {
		return nil
	}
	qs := []string{ob.topo.Config().Queue}
	for _, t := range ob.topo.Tiers() {
		qs = append(qs, t.Topic)
	}
	if all {
		qs = append(qs, ob.topo.Config().PoisonQueue)
	}
	return qs
}

// disruptOutbox SIGKILLs consumers as the kill scenario does, then stops
// RabbitMQ for -outbox-down while it writes -outbox-writes rows into the
// outbox, and measures how long after the broker's return the rows then
// pending are relayed, and every row written during the outage received.
func (w *world) disruptOutbox(ctx context.Context, rng *rand.Rand) error {
	if err := w.disrupt(ctx, rng, "kill"); err != nil {
		return err
	}
	if err := w.db.GetContext(ctx, &w.ob.at, "SELECT count(DISTINCT event_id) FROM "+w.name+".effects"); err != nil {
		return err
	}
	if err := ctl("stop_app"); err != nil {
		return err
	}
	down := time.Now()
	err := w.ob.write(ctx, w.db, w.o.outboxWrites, down, w.o.outboxDown)
	var last int64 // the newest row pending
	if err == nil {
		var r struct {
			N    int   `db:"n"`
			Last int64 `db:"last"`
		}
		err = w.db.GetContext(ctx, &r, "SELECT count(*) AS n, coalesce(max(id), 0) AS last FROM "+w.name+".outbox")
		w.ob.pending, last = r.N, r.Last
	}
	// Back up whatever happened.
	boot, startErr := testenv.StartApp(ctx, testenv.TryRabbitmqctl, testenv.RabbitMQRoot)
	w.restart = &testenv.Restart{Boot: boot}
	if startErr != nil {
		return errors.Join(err, fmt.Errorf("starting RabbitMQ again: %w", startErr))
	}
	back := time.Now()
	w.ob.down = back.Sub(down)
	if err != nil {
		return err
	}
	for {
		var n, left int
		err := w.db.GetContext(ctx, &n, "SELECT count(DISTINCT event_id) FROM "+w.name+".received WHERE event_id LIKE 'direct:%'")
		if err == nil && w.ob.relayed == 0 {
			err = w.db.GetContext(ctx, &left, "SELECT count(*) FROM "+w.name+".outbox WHERE id <= $1", last)
			if err == nil && left == 0 {
				w.ob.relayed = time.Since(back)
			}
		}
		if err == nil && w.ob.relayed > 0 && n >= w.o.outboxWrites {
			w.ob.recovery = time.Since(back)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d/%d rows written during the outage received: %w", n, w.o.outboxWrites, errors.Join(err, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// directID is the event id of the i-th row the harness writes itself.
func directID(i int) string { return fmt.Sprintf("direct:%06d", i) }

// write writes n rows for the receiver into the outbox, directBatch per
// transaction, spread evenly over d from start, and returns at start+d.
func (ob *outboxWorld) write(ctx context.Context, db *sqlx.DB, n int, start time.Time, d time.Duration) error {
	batches := (n + directBatch - 1) / directBatch
	for b := range batches {
		if err := waitUntil(ctx, start.Add(d*time.Duration(b)/time.Duration(batches))); err != nil {
			return err
		}
		msgs := make([]*message.Message, 0, directBatch)
		for i := b * directBatch; i < min(n, (b+1)*directBatch); i++ {
			m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"eventId":%q}`, directID(i))))
			m.Metadata.Set(sluice.EventIDKey, directID(i))
			msgs = append(msgs, m)
		}
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		if err := ob.store.Write(ctx, tx, ob.topo.Config().Queue, msgs...); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return waitUntil(ctx, start.Add(d))
}

// waitUntil waits until t or until ctx ends.
func waitUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// expected returns the event ids the receiver must get: the one each valid
// event produces, and those the harness wrote.
func (ob *outboxWorld) expected(p plan, direct int) map[string]bool {
	ids := make(map[string]bool, len(p.valid)+direct)
	for id := range p.valid {
		ids[producedID(id)] = true
	}
	for i := range direct {
		ids[directID(i)] = true
	}
	return ids
}

// observe reads the receiver's business rows (event id → rows), the rows
// left in the outbox and the receiver's poison queue's depth.
func (w *world) observeOutbox(ctx context.Context) (received map[string]int, left, poisoned int, err error) {
	var rows []struct {
		ID string `db:"event_id"`
		N  int    `db:"n"`
	}
	if err := w.db.SelectContext(ctx, &rows, "SELECT event_id, count(*) AS n FROM "+w.name+".received GROUP BY event_id"); err != nil {
		return nil, 0, 0, err
	}
	received = make(map[string]int, len(rows))
	for _, r := range rows {
		received[r.ID] = r.N
	}
	if err := w.db.GetContext(ctx, &left, "SELECT count(*) FROM "+w.name+".outbox"); err != nil {
		return nil, 0, 0, err
	}
	err = w.withConn(func(c *amqp.Connection) error {
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		info, err := ch.QueueDeclarePassive(w.ob.topo.Config().PoisonQueue, true, false, false, false, nil)
		poisoned = info.Messages
		return err
	})
	return received, left, poisoned, err
}

// settledOutbox reports whether the receiver has every expected event and
// the outbox is empty (the queues' depth is the harness's check); true
// outside the outbox scenario.
func (w *world) settledOutbox(ctx context.Context, p plan) (bool, string) {
	if w.ob == nil {
		return true, ""
	}
	received, left, _, err := w.observeOutbox(ctx)
	if err != nil {
		return false, err.Error()
	}
	want := w.ob.expected(p, w.o.outboxWrites)
	n := 0
	for id := range received {
		if want[id] {
			n++
		}
	}
	return n >= len(want) && left == 0, fmt.Sprintf(", %d/%d received, %d left in the outbox", n, len(want), left)
}

// verifyOutbox compares the receiver's rows with what was produced,
// exactly, and reports the figures: what the relays confirmed and the
// receiver's inbox skipped (from the consumers' "count" lines), and the
// outage's recovery.
func (w *world) verifyOutbox(p plan) (string, []string) {
	if w.ob == nil {
		return "", nil
	}
	received, left, poisoned, err := w.observeOutbox(context.Background())
	if err != nil {
		return "; outbox: observe", []string{err.Error()}
	}
	want := w.ob.expected(p, w.o.outboxWrites)
	twice, problems := exactlyOnce(received, want, "unexpected received event ", "produced event never received ")
	if twice > 0 {
		problems = append(problems, fmt.Sprintf("%d produced events received twice", twice))
	}
	if left > 0 {
		problems = append(problems, fmt.Sprintf("%d rows left in the outbox", left))
	}
	if poisoned > 0 {
		problems = append(problems, fmt.Sprintf("%d produced events in the receiver's poison queue", poisoned))
	}
	counts := map[string]int{}
	for _, s := range w.procs {
		for k, v := range s.counts {
			counts[k] += v
		}
	}
	res := fmt.Sprintf("; outbox: produced %d (%d by the handler, %d written during the outage), relayed %d, received %d == %d, %d twice, %d duplicates skipped by the receiver's inbox, outbox empty: %v; broker down %s from %d/%d effects on, %d rows pending at its return, relayed %s and all received %s after it",
		len(want), len(p.valid), w.o.outboxWrites, counts["relayed"], len(received), len(want), twice, counts["duplicate"], left == 0,
		w.ob.down.Round(100*time.Millisecond), w.ob.at, len(p.valid), w.ob.pending, w.ob.relayed.Round(100*time.Millisecond), w.ob.recovery.Round(100*time.Millisecond))
	return res, problems
}

// exactlyOnce compares the rows of each id with the ids wanted: it returns
// how many ids have more than one row, and a problem per id unexpected and
// per id missing, each its prefix and the id.
func exactlyOnce(got map[string]int, want map[string]bool, unexpected, missing string) (twice int, problems []string) {
	for id, n := range got {
		if n > 1 {
			twice++
		}
		if !want[id] {
			problems = append(problems, unexpected+id)
		}
	}
	for id := range want {
		if got[id] == 0 {
			problems = append(problems, missing+id)
		}
	}
	return twice, problems
}

// describeOutbox is the outbox scenario's disruption.
func describeOutbox(killed int, crashes map[string]int, restarts, at, total int) string {
	var parts []string
	for _, k := range outboxCrashPoints {
		parts = append(parts, fmt.Sprintf("%s %d", k, crashes[k]))
	}
	return fmt.Sprintf("%d SIGKILLs from %d/%d effects on + self-crashes %s; %d restarts; then RabbitMQ stopped while rows are written into the outbox",
		killed, at, total, strings.Join(parts, ", "), restarts)
}

// countLine parses a consumer's "count <name> <n>" line.
func countLine(line string) (string, int, bool) {
	rest, ok := strings.CutPrefix(line, "count ")
	if !ok {
		return "", 0, false
	}
	name, num, ok := strings.Cut(rest, " ")
	n, err := strconv.Atoi(num)
	return name, n, ok && err == nil
}
