package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluiceredis"
	"github.com/sluicemq/sluice/sluicesql"
)

// recovering is a consumer of the bed's queue with the whole stack, the
// PostgreSQL inbox and the replay stage, whose handler still fails the
// events stillBad says.
type recovering struct {
	db            string // schema
	pg            *sqlx.DB
	outcomesTable string
	mu            sync.Mutex
	handled       map[string]int
}

func newRecovering(t *testing.T, b *bed, stillBad func(id string) bool) *recovering {
	t.Helper()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(`CREATE TABLE ` + schema + `.stock (event_id TEXT NOT NULL)`)
	require.NoError(t, err)
	inbox := testenv.SQLStore(t, db, schema+".inbox")
	outcomes := testenv.OutcomeStore(t, db, schema+".sluice_replay")
	rc := &recovering{db: schema, pg: db, outcomesTable: schema + ".sluice_replay", handled: map[string]int{}}

	consume(t, b, func(msg *message.Message) error {
		id := msg.Metadata.Get(sluice.EventIDKey)
		rc.mu.Lock()
		rc.handled[id]++
		rc.mu.Unlock()
		if stillBad(id) {
			return sluice.Poison(fmt.Errorf("event %s: unknown schema version 3", id))
		}
		_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), `INSERT INTO `+schema+`.stock (event_id) VALUES ($1)`, id)
		return err
	}, &replay.Config{Store: outcomes, InUnitOfWork: true}, inbox)
	return rc
}

// rows is how many business rows the consumer wrote.
func (rc *recovering) rows(t *testing.T) int {
	t.Helper()
	var c int
	require.NoError(t, rc.pg.Get(&c, `SELECT count(*) FROM `+rc.db+`.stock`))
	return c
}

// exhausted poisons n events, prefix000…, whose retries were exhausted.
func (b *bed) exhausted(t *testing.T, prefix string, n int) {
	t.Helper()
	for i := range n {
		b.poisoned(t, fmt.Sprintf("%s%03d", prefix, i), "order.created", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))
	}
}

// goodAndBad poisons good events good-000… (exhausted while the stock
// service was down: fixed since) and bad ones bad-00… (still bad).
func (b *bed) goodAndBad(t *testing.T, good, bad int) {
	t.Helper()
	for i := range good {
		b.poisoned(t, fmt.Sprintf("good-%03d", i), "stock.reserved", sluice.NewFailure(sluice.ClassExhausted, errors.New("stock service: timeout")))
	}
	for i := range bad {
		b.poisoned(t, fmt.Sprintf("bad-%02d", i), "stock.reserved", sluice.Poison(errors.New("unknown schema version 3")))
	}
}

// consume runs a consumer "stock" of the bed's queue until t ends: the
// handler behind the whole stack, with the replay stage and the inbox given.
func consume(t *testing.T, b *bed, handler message.NoPublishHandlerFunc, rp *replay.Config, inbox deduplication.Store) {
	t.Helper()
	sub, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	log := testenv.NewLog()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, log)
	require.NoError(t, err)
	t.Cleanup(func() { // what went wrong in the consumer, for a test that failed
		if t.Failed() {
			for _, l := range log.Lines("") {
				if l.Level == "error" || strings.Contains(l.Msg, "eplay") {
					t.Logf("consumer: %s: %s", l.Level, l.Text())
				}
			}
		}
	})
	_, err = router.Add(r, router.HandlerConfig{
		Name: "stock", Topic: b.topo.Config().Queue, Subscriber: sub, Handler: handler,
		Stages: router.Stages{
			Replay:   rp,
			Poison:   &poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue},
			Retry:    &retrytiers.Config{Publisher: b.pub, Tiers: b.topo.Tiers()},
			Classify: &stage.ClassifyConfig{},
			Inbox:    &deduplication.Config{Store: inbox, Consumer: "stock"},
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })
}

// The runbook's recover and confirm steps: 200 events were exhausted while
// the stock service was down (fixed now), 30 more are still bad. A canary of
// 5, then batches of 20 and 105, stops as soon as a batch is poisoned again
// beyond 10%; the report lists exactly the 30 with their new reason; every
// good event has one business row and one inbox row.
func TestClosedLoopReplayStopsOnRepoisonAndReports(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.goodAndBad(t, 200, 30)
	rc := newRecovering(t, b, func(id string) bool { return strings.HasPrefix(id, "bad-") })

	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "5", "--ramp", "20,105",
		"--max-repoison", "10%", "--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--wait", outcomeWait)
	require.Equal(t, 1, code, "a stop exits 1: %s\n%s", out, errOut)
	t.Logf("sluice dlq replay --canary 5 --ramp 20,105 --max-repoison 10%%:\n%s%s", out, errOut)
	require.Contains(t, out, "batch 1 (canary, 5): 5 replayed, 5 with a final outcome, 0 poisoned again")
	require.Contains(t, out, "batch 2 (ramp, 20): 20 replayed, 20 with a final outcome, 0 poisoned again")
	require.Contains(t, out, "batch 3 (ramp, 105): 105 replayed, 105 with a final outcome, 0 poisoned again")
	require.Contains(t, out, "batch 4 (ramp, 105): 100 replayed, 100 with a final outcome, 30 poisoned again")
	require.Contains(t, out, "stopped: 30% poisoned again, more than --max-repoison 10%")
	require.Contains(t, errOut, "replay stopped")
	run := regexp.MustCompile(`replay run (run-\S+)`).FindStringSubmatch(out)
	require.Len(t, run, 2, out)

	code, report, errOut := b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--run", run[1])
	require.Equal(t, 0, code, "every replayed event has its outcome: %s", errOut)
	t.Logf("sluice dlq report:\n%s", report)
	require.Contains(t, report, "run "+run[1]+": 200 processed, 30 poisoned")
	var listed []string
	for _, line := range strings.Split(report, "\n") {
		if strings.HasPrefix(line, "  ") {
			require.Contains(t, line, "poisoned\tpoison\tpoison: event ")
			require.Contains(t, line, "unknown schema version 3")
			listed = append(listed, strings.TrimPrefix(strings.Fields(line)[0]+" "+strings.Fields(line)[1], "event ")) // "event <id>": as every page names it
		}
	}
	require.Len(t, listed, 30)
	for _, id := range listed {
		require.True(t, strings.HasPrefix(id, "bad-"), id)
	}

	db := testenv.Postgres(t)
	var rows, distinct, claims int
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM `+rc.db+`.stock`))
	require.NoError(t, db.Get(&distinct, `SELECT count(DISTINCT event_id) FROM `+rc.db+`.stock`))
	require.NoError(t, db.Get(&claims, `SELECT count(*) FROM `+rc.db+`.inbox`))
	require.Equal(t, 200, rows)
	require.Equal(t, 200, distinct)
	require.Equal(t, 200, claims)
	rc.mu.Lock()
	for id, n := range rc.handled {
		require.Equal(t, 1, n, "%s handled once", id)
	}
	rc.mu.Unlock()
	require.Len(t, peekIDs(t, b.topo.Config().PoisonQueue), 30, "the 30 are back in the poison queue with their new diagnosis")

	// Confirm: two of the 30 were repaired by hand; the other 28 are
	// archived. The report then accounts for every dead letter.
	code, out, errOut = b.cli(t, "dlq", "resolve", "--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable,
		"--run", run[1], "--event", "bad-00,bad-01", "--reason", "re-sent as version 2 by the order team, INC-77")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "2 events of run "+run[1]+" recorded compensated")
	archive := filepath.Join(t.TempDir(), "bad.jsonl")
	code, out, errOut = b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--error-match", "version 3", "--to", archive,
		"--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "outcomes recorded as run archive-")
	code, report, errOut = b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, report, "run "+run[1]+": 200 processed, 28 poisoned, 2 compensated")
	require.Regexp(t, `run archive-\S+: 30 archived`, report)
	require.Contains(t, report, "bad-00\tcompensated\tpoison\tre-sent as version 2 by the order team, INC-77")
	last := b.auditLines(t)
	require.Equal(t, "dlq resolve", last[len(last)-2].Command)
	require.Equal(t, []string{"bad-00", "bad-01"}, last[len(last)-2].Items)

	// A report of a run with events sent and no outcome yet exits 1.
	outcomes, err := sluicesql.NewOutcomes(db, sluicesql.OutcomesConfig{Table: rc.outcomesTable})
	require.NoError(t, err)
	require.NoError(t, outcomes.Replayed(t.Context(), []replay.Record{{Run: "run-pending", Item: "evt-x", EventID: "evt-x", At: time.Now()}}))
	code, report, errOut = b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--run", "run-pending")
	require.Equal(t, 1, code, report)
	require.Contains(t, report, "evt-x\treplayed")
	require.Contains(t, errOut, "1 replayed events have no final outcome yet")
}

// Two copies of one event in the poison queue (a poisoning redelivered
// after a crash) are one item: the batch is judged by events, and the
// run does not wait for a second outcome that cannot come.
func TestDuplicateCopiesAreOneItem(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	for range 2 {
		b.poisoned(t, "twice-1", "stock.reserved", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))
	}
	b.poisoned(t, "once-1", "stock.reserved", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))
	rc := newRecovering(t, b, func(string) bool { return false })
	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "3",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--wait", outcomeWait)
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	require.Contains(t, out, "batch 1 (canary, 3): 3 replayed (2 events), 2 with a final outcome, 0 poisoned again")
	require.NotContains(t, out, "stopped")
}

// A canary that does not all come back processed stops the run before
// anything more moves.
func TestCanaryStopsTheRun(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.poisoned(t, "bad-1", "stock.reserved", sluice.Poison(errors.New("unknown schema version 3")))
	for i := range 10 {
		b.poisoned(t, fmt.Sprintf("good-%d", i), "stock.reserved", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))
	}
	rc := newRecovering(t, b, func(id string) bool { return strings.HasPrefix(id, "bad-") })
	code, out, _ := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "2", "--ramp", "5",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--wait", outcomeWait)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "stopped: 1 of the 2 canary events were not processed")
	require.Contains(t, out, "bad-1\tpoisoned\tpoison")
	require.Len(t, peekIDs(t, b.topo.Config().PoisonQueue), 10, "9 good left unreplayed, bad-1 back")

	code, _, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "2", "--dry-run", "--outcomes", testenv.PostgresURL)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--dry-run lists what a replay would move")
	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--ramp", "5,x", "--outcomes", testenv.PostgresURL)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `--ramp "5,x": want batch sizes such as 5,20,100`)
	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "2")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--canary and --ramp need --outcomes")
}

// foreignPoisoned isolates, through the real poison stage, a message a
// Spring producer sent with its properties and a binary (gzip) body.
func foreignPoisoned(t *testing.T, b *bed, id string) amqp.Publishing {
	t.Helper()
	ch := testenv.Channel(t, testenv.AMQP(t))
	pub := amqp.Publishing{
		ContentType: "application/json", ContentEncoding: "gzip", CorrelationId: "corr-" + id, MessageId: "m-" + id,
		Type: "OrderCreated", AppId: "spring-orders", ReplyTo: "orders.replies", Priority: 3,
		Timestamp: time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC),
		Headers:   amqp.Table{sluice.EventIDKey: id, "__TypeId__": "com.example.OrderCreated"},
		Body:      []byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xffgzip-bytes-" + id),
	}
	require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", b.topo.Config().Queue, false, false, pub))
	d, ok, err := ch.Get(b.topo.Config().Queue, false)
	require.NoError(t, err)
	require.True(t, ok)
	msg, err := rabbitmq.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	mw, err := poison.New(poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue})
	require.NoError(t, err)
	_, err = mw(func(*message.Message) ([]*message.Message, error) { return nil, sluice.Poison(errors.New("bad")) })(msg)
	require.NoError(t, err)
	require.NoError(t, d.Ack(false))
	return pub
}

// archive → restore, through a file and through a table, keeps every
// message byte for byte (body, headers, the producer's properties); discard
// needs a reason and records every event it removed, with the operator, in
// the audit log.
func TestArchiveRestoreDiscard(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	conn := testenv.AMQP(t)
	sent := map[string]amqp.Publishing{}
	for _, id := range []string{"f-1", "f-2"} {
		sent[id] = foreignPoisoned(t, b, id)
	}
	before := testenv.Drain(t, conn, b.topo.Config().PoisonQueue)
	require.Len(t, before, 2)
	ch := testenv.Channel(t, conn)
	putBack := func(ds []amqp.Delivery) { // as they were
		for _, d := range ds {
			require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", b.topo.Config().PoisonQueue, false, false, amqp.Publishing{
				Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
				Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, MessageId: d.MessageId,
				Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
			}))
		}
	}
	same := func(after []amqp.Delivery) { // body, properties and headers as before
		require.Len(t, after, 2)
		for i, d := range after {
			w := before[i]
			require.Equal(t, w.Body, d.Body)
			require.Equal(t, []any{w.ContentType, w.ContentEncoding, w.CorrelationId, w.MessageId, w.Type, w.AppId, w.ReplyTo, w.Priority},
				[]any{d.ContentType, d.ContentEncoding, d.CorrelationId, d.MessageId, d.Type, d.AppId, d.ReplyTo, d.Priority})
			require.True(t, w.Timestamp.Equal(d.Timestamp))
			for k, v := range w.Headers {
				if strings.HasPrefix(k, "sluice_publish_id") {
					continue // the publisher's own confirm tag
				}
				require.Equal(t, fmt.Sprint(v), fmt.Sprint(d.Headers[k]), "header %s", k)
			}
		}
		require.Equal(t, sent["f-1"].Body, after[0].Body)
	}
	putBack(before)

	file := filepath.Join(t.TempDir(), "poison.jsonl")
	code, _, errOut := b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to", file)
	require.Equal(t, 0, code, errOut)
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))
	code, out, errOut := b.cli(t, "dlq", "restore", "--from", file)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "restore from "+file)
	after := testenv.Drain(t, conn, b.topo.Config().PoisonQueue)
	same(after)

	// The same round trip through a table.
	db := testenv.Postgres(t)
	putBack(after)
	table := testenv.Schema(t, db) + ".sluice_archive"
	code, _, errOut = b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))
	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	after = testenv.Drain(t, conn, b.topo.Config().PoisonQueue)
	same(after)

	for _, d := range after { // back into the poison queue for the discard
		require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", b.topo.Config().PoisonQueue, false, false, amqp.Publishing{Headers: d.Headers, Body: d.Body}))
	}
	// Published without a confirm: another channel's count may not have them yet.
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue) == 2 }, time.Minute, 10*time.Millisecond)
	code, _, errOut = b.cli(t, "dlq", "discard", "--queue", b.topo.Config().PoisonQueue)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--reason is required")
	require.Equal(t, 2, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))
	outcomes := testenv.Schema(t, db) + ".sluice_replay"
	code, out, errOut = b.cli(t, "dlq", "discard", "--queue", b.topo.Config().PoisonQueue, "--reason", "test orders from the load test, INC-42",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", outcomes)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "outcomes recorded as run discard-")
	var discarded []string
	require.NoError(t, db.Select(&discarded, `SELECT item || ' ' || outcome || ' ' || reason || ' ' || handler FROM `+outcomes+` ORDER BY item`))
	require.Equal(t, []string{
		"f-1 discarded test orders from the load test, INC-42 operator tester",
		"f-2 discarded test orders from the load test, INC-42 operator tester",
	}, discarded)
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))
	recs := b.auditLines(t)
	last := recs[len(recs)-1]
	require.Equal(t, "dlq discard", last.Command)
	require.Equal(t, "tester", last.Operator)
	require.Equal(t, "test orders from the load test, INC-42", last.Reason)
	require.ElementsMatch(t, []string{"f-1", "f-2"}, last.Items)
	require.Equal(t, "restore", strings.TrimPrefix(recs[len(recs)-2].Command, "dlq "))
}

// sluice queues shows each family: main, tiers, poison, with depth,
// consumers and the oldest isolation; a missing queue is said missing.
func TestQueues(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	code, out, errOut := b.cli(t, "queues", "--queue", b.topo.Config().Queue, "--tiers", "1m", "--queue", "no_such_queue_"+b.topo.Config().Queue)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, regexp.QuoteMeta(b.topo.Config().Queue)+`\s+│ main\s+│ 0\s+│ -\s+│ -\s+│ 0\s+│ -`, out)
	require.Regexp(t, regexp.QuoteMeta(b.topo.Config().Queue+".retry.1m")+`\s+│ tier 1m\s+│ 0`, out)
	require.Regexp(t, regexp.QuoteMeta(b.topo.Config().PoisonQueue)+`\s+│ poison\s+│ 6\s+│ -\s+│ -\s+│ 0\s+│ \d+s \(poisoned\)`, out)
	require.Regexp(t, `no_such_queue_\S+\s+│ main\s+│ missing`, out)
	require.Equal(t, 6, testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().PoisonQueue), "reading the head removed nothing")

	code, out, _ = b.cli(t, "queues", "--queue", b.topo.Config().Queue, "--tiers", "1m", "--json")
	require.Equal(t, 0, code)
	require.Equal(t, 3, strings.Count(out, "\n"))
	require.Contains(t, out, `"role":"poison","ready":6`)
	code, _, errOut = b.cli(t, "queues")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--queue or --management-url is required")
}

// Issue 29.6: after node kills, a quorum tier held 346 copies — messages
// 346, ready 0, unacked 0, the broker's dead-lettering waiting on a target
// leader — and sluice queues showed the tier empty (READY 0). It now shows
// every message the broker counts and says how many are held, and lists
// every queue of a jittered tier. The held state needs a 3-node cluster
// with its leaders killed under load, so the management API's answer is a
// fake here (the queues and their ready counts are the real broker's).
func TestQueuesShowWhatATierHoldsInEveryState(t *testing.T) {
	t.Parallel()
	q := testenv.Name("held")
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: q, TierDelays: []time.Duration{time.Minute},
		TierJitter: broker.Jitter{Fraction: 0.2, Queues: 2}})
	require.NoError(t, err)
	_, err = topo.Declare(t.Context(), testenv.AMQP(t))
	require.NoError(t, err)
	var names []string
	for _, tq := range topo.Queues() {
		names = append(names, tq.Name)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	require.Len(t, names, 4, "main, two queues of the jittered tier, poison")
	tier := names[1]
	mgmt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var listed []map[string]any
		for _, n := range names {
			m := map[string]any{"name": n, "messages": 0, "messages_unacknowledged": 0}
			if n == tier {
				m["messages"] = 346
			}
			listed = append(listed, m)
		}
		_ = json.NewEncoder(w).Encode(listed)
	}))
	t.Cleanup(mgmt.Close)

	var out, errOut strings.Builder
	code := run([]string{"--amqp-url", testenv.AMQPURL, "queues", "--queue", q, "--tiers", "1m", "--tier-jitter", "0.2", "--tier-jitter-queues", "2",
		"--management-url", mgmt.URL}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Regexp(t, regexp.QuoteMeta(tier)+`\s+│ tier 1m\s+│ 0\s+│ 0\s+│ 346 \(346 held\)`, out.String())
	require.Regexp(t, regexp.QuoteMeta(names[2])+`\s+│ tier 1m\s+│ 0\s+│ 0\s+│ 0 `, out.String(), "the jittered tier's other queue")
	require.Contains(t, out.String(), "346 message(s) held")
	require.Contains(t, out.String(), "docs/scaling.md")

	out.Reset()
	code = run([]string{"--amqp-url", testenv.AMQPURL, "queues", "--queue", q, "--tiers", "1m", "--tier-jitter", "0.2", "--tier-jitter-queues", "2",
		"--management-url", mgmt.URL, "--json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Contains(t, out.String(), `"queue":"`+tier+`","role":"tier 1m","ready":0,"unacked":0,"messages":346`)
}

// With the management API, sluice queues lists every family the broker has
// in the AMQP URL's vhost (the test's own, on the package's private node)
// — without being told their names — and nothing else.
func TestQueuesDiscoversTheFamilies(t *testing.T) {
	t.Parallel()
	node, _ := privateNode(t)
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: node.URL}, "test")
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	for _, cfg := range []rabbitmq.TopologyConfig{
		{Queue: "orders", TierDelays: []time.Duration{5 * time.Minute, 30 * time.Second}},
		{Queue: "billing", TierDelays: []time.Duration{time.Minute}},
	} {
		topo, err := rabbitmq.NewTopology(cfg)
		require.NoError(t, err)
		_, err = topo.Declare(t.Context(), conn)
		require.NoError(t, err)
	}
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("unrelated", true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: node.URL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	mw, err := poison.New(poison.Config{Publisher: pub, Topic: "orders.poison", Queue: "orders"})
	require.NoError(t, err)
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "o-1")
	_, err = mw(func(*message.Message) ([]*message.Message, error) { return nil, sluice.Poison(errors.New("bad")) })(m)
	require.NoError(t, err)

	// orders: a message a producer stamped 90 s ago waits in the main
	// queue; billing: a consumer holds one delivery unacked.
	ch, err = conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	stamped := time.Now().Add(-90 * time.Second).Truncate(time.Second)
	require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", "orders", false, false, amqp.Publishing{Timestamp: stamped, Body: []byte(`{}`)}))
	require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", "billing", false, false, amqp.Publishing{Body: []byte(`{}`)}))
	held, err := ch.Consume("billing", "", false, false, false, false, nil)
	require.NoError(t, err)
	<-held

	var out, errOut strings.Builder
	var got []string
	rows := map[string]queueRow{}
	require.EventuallyWithT(t, func(c *assert.CollectT) { // the management API's statistics lag a second
		out.Reset()
		errOut.Reset()
		code := run([]string{"--amqp-url", node.URL, "queues", "--management-url", node.ManagementURL, "--json"}, &out, &errOut)
		require.Equal(c, 0, code, errOut.String())
		got = nil
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var r queueRow
			require.NoError(c, json.Unmarshal([]byte(line), &r))
			got = append(got, fmt.Sprintf("%s %s %s %d", r.Family, r.Queue, r.Role, r.Ready))
			rows[r.Queue] = r
		}
		require.NotNil(c, rows["billing"].Unacked)
		require.Equal(c, 1, *rows["billing"].Unacked)
		require.False(c, rows["orders"].HeadPublishedAt.IsZero())
	}, 2*time.Minute, 200*time.Millisecond)
	require.Equal(t, []string{
		"billing billing main 0", "billing billing.retry.1m tier 1m 0", "billing billing.poison poison 0",
		"orders orders main 1", "orders orders.retry.30s tier 30s 0", "orders orders.retry.5m tier 5m 0", "orders orders.poison poison 1",
	}, got)
	require.Equal(t, 1, rows["billing"].Consumers)
	require.Equal(t, stamped, rows["orders"].HeadPublishedAt.Local(), "the head message's AMQP timestamp")
	require.WithinDuration(t, time.Now(), rows["orders.poison"].OldestPoisonedAt, time.Minute)
	require.NotNil(t, rows["orders.poison"].Unacked) // 0, or 1 when the statistics caught the CLI's own read of its head
	require.Zero(t, *rows["orders.retry.30s"].Unacked)
	require.True(t, rows["orders.retry.30s"].HeadPublishedAt.IsZero(), "an empty queue has no head")

	out.Reset()
	code := run([]string{"--amqp-url", node.URL, "queues", "--management-url", node.ManagementURL}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Regexp(t, `orders\s+│ main\s+│ 1\s+│ 0\s+│ 1\s+│ 0\s+│ \dm\d+s \(published\)`, out.String())
	// UNACKED is 0, or 1 when the statistics caught the CLI's own read of its head.
	require.Regexp(t, `orders.poison\s+│ poison\s+│ 1\s+│ [01]\s+│ 1\s+│ 0\s+│ (\dm)?\d+s \(poisoned\)`, out.String())
	t.Log("\n" + out.String())

	code = run([]string{"--amqp-url", "amqp://guest:Secret9@127.0.0.1:1/", "queues", "--management-url", node.ManagementURL}, &out, &errOut)
	require.Equal(t, 1, code)
	require.Contains(t, errOut.String(), "management API answered 401")
	require.NotContains(t, errOut.String(), "Secret9")
}

// archive --to-table keeps each record in a table; restore --from-table
// publishes the rows back (a dry run changes nothing; --event-id selects),
// marks each restored once its publish is confirmed, and a rerun restores
// nothing twice.
func TestArchiveToATableAndRestore(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	db := testenv.Postgres(t)
	table := testenv.Schema(t, db) + ".sluice_archive"
	code, _, errOut := b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to-table", table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--to-table needs --db")
	code, _, errOut = b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--class", "exhausted", "--to-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"e1", "e3", "e5"}, peekIDs(t, b.topo.Config().PoisonQueue))
	var records []string
	require.NoError(t, db.Select(&records, `SELECT record FROM `+table+` WHERE class = 'exhausted' AND archived_by = 'tester' ORDER BY event_id`))
	require.Len(t, records, 3)

	code, out, errOut := b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL, "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "WOULD RESTORE")
	for _, e := range []string{"event e2", "event e4", "event e6"} {
		require.Contains(t, out, e)
	}
	require.Equal(t, []string{"e1", "e3", "e5"}, peekIDs(t, b.topo.Config().PoisonQueue), "a dry run publishes nothing")

	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL, "--event-id", "e4")
	require.Equal(t, 0, code, errOut)
	require.ElementsMatch(t, []string{"e1", "e3", "e5", "e4"}, peekIDs(t, b.topo.Config().PoisonQueue))
	code, out, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `done\s+│\s+2`, out)
	require.ElementsMatch(t, []string{"e1", "e2", "e3", "e4", "e5", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue))
	var restored []struct {
		EventID    string `db:"event_id"`
		RestoredBy string `db:"restored_by"`
	}
	require.NoError(t, db.Select(&restored, `SELECT event_id, restored_by FROM `+table+` WHERE restored_at IS NOT NULL ORDER BY event_id`))
	require.Len(t, restored, 3)
	require.Equal(t, "tester", restored[0].RestoredBy)

	code, out, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `done\s+│\s+0`, out, "a rerun restores nothing twice")
	require.Len(t, peekIDs(t, b.topo.Config().PoisonQueue), 6)
	last := b.auditLines(t)
	require.Equal(t, "dlq restore", last[len(last)-1].Command)
	require.Equal(t, table, last[len(last)-1].Options["from_table"])

	code, _, errOut = b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to", filepath.Join(t.TempDir(), "a.jsonl"), "--to-table", table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "exactly one of --to FILE and --to-table TABLE")
	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", testenv.Schema(t, db)+".missing", "--db", testenv.PostgresURL)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "reading the archive table")
	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--from-table needs --db")
}

// Two restores of one table at once take different rows: every archived
// message is published back exactly once.
func TestConcurrentRestoresFromATable(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	const n = 80
	for i := range n {
		b.poisoned(t, fmt.Sprintf("c%03d", i), "order.created", sluice.Poison(errors.New("bad")))
	}
	db := testenv.Postgres(t)
	table := testenv.Schema(t, db) + ".sluice_archive"
	code, _, errOut := b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	require.Empty(t, peekIDs(t, b.topo.Config().PoisonQueue))

	var wg sync.WaitGroup
	codes := make([]int, 2)
	outs := make([]string, 2)
	for i := range codes {
		wg.Go(func() {
			codes[i], outs[i], _ = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
		})
	}
	wg.Wait()
	require.Equal(t, []int{0, 0}, codes, "%s\n%s", outs[0], outs[1])
	got := ids(t, b.topo.Config().PoisonQueue)
	require.Len(t, got, n, "each row published once")
	seen := map[string]bool{}
	for _, id := range got {
		require.False(t, seen[id], "event %s restored twice", id)
		seen[id] = true
	}
	var left int
	require.NoError(t, db.Get(&left, `SELECT count(*) FROM `+table+` WHERE restored_at IS NULL`))
	require.Zero(t, left)
}

// An event id longer than the outcome table keeps (400 bytes; the inbox
// takes up to 512) is one item for the CLI and the consumer alike: the
// canary comes back processed instead of waiting out --wait.
func TestLongEventIDIsOneItem(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	long := "evt-" + strings.Repeat("é", 198) // 400 bytes, cut on a character boundary
	b.poisoned(t, long, "stock.reserved", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))
	rc := newRecovering(t, b, func(string) bool { return false })
	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "1",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--wait", outcomeWait)
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	require.Contains(t, out, "batch 1 (canary, 1): 1 replayed, 1 with a final outcome, 0 poisoned again")
	code, report, errOut := b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, report, ": 1 processed\n")
}

// The closed loop for a service with no SQL database: its inbox and its
// outcome records on Redis (sluiceredis.Outcomes),
// its effect a Redis set. `--outcomes redis://…` replays a canary and a
// ramp, stops when a batch is poisoned again beyond the limit, and reports
// exactly the still-bad events; `resolve` records one as compensated.
func TestClosedLoopOnRedis(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.goodAndBad(t, 40, 6)
	client, prefix := testenv.Redis(t)
	inbox, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{Prefix: prefix + "inbox:"})
	require.NoError(t, err)
	outcomesPrefix := strings.TrimSuffix(prefix, ":") + "_replay"
	outcomes, err := sluiceredis.NewOutcomes(client, sluiceredis.OutcomesConfig{Prefix: outcomesPrefix + ":"})
	require.NoError(t, err)
	stock := prefix + "stock"

	consume(t, b, func(msg *message.Message) error {
		id := msg.Metadata.Get(sluice.EventIDKey)
		if strings.HasPrefix(id, "bad-") {
			return sluice.Poison(fmt.Errorf("event %s: unknown schema version 3", id))
		}
		return client.SAdd(msg.Context(), stock, id).Err()
	}, &replay.Config{Store: outcomes}, inbox)

	redisURL := "redis://" + testenv.RedisAddr + "/0"
	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "5", "--ramp", "20,100",
		"--max-repoison", "10%", "--outcomes", redisURL, "--outcomes-table", outcomesPrefix, "--wait", outcomeWait)
	require.Equal(t, 1, code, "a stop exits 1: %s\n%s", out, errOut)
	t.Logf("sluice dlq replay --outcomes redis://…:\n%s", out)
	require.Contains(t, out, "batch 1 (canary, 5): 5 replayed, 5 with a final outcome, 0 poisoned again")
	require.Contains(t, out, "batch 2 (ramp, 20): 20 replayed, 20 with a final outcome, 0 poisoned again")
	require.Contains(t, out, "batch 3 (ramp, 100): 21 replayed, 21 with a final outcome, 6 poisoned again")
	run := regexp.MustCompile(`replay run (run-\S+)`).FindStringSubmatch(out)
	require.Len(t, run, 2, out)

	code, report, errOut := b.cli(t, "dlq", "report", "--outcomes", redisURL, "--outcomes-table", outcomesPrefix)
	require.Equal(t, 0, code, "every replayed event has its outcome: %s", errOut)
	require.Contains(t, report, "run "+run[1]+": 40 processed, 6 poisoned")
	require.Equal(t, 6, strings.Count(report, "unknown schema version 3"), report)
	members, err := client.SMembers(t.Context(), stock).Result()
	require.NoError(t, err)
	require.Len(t, members, 40, "each good event's effect, once")

	code, _, errOut = b.cli(t, "dlq", "resolve", "--outcomes", redisURL, "--outcomes-table", outcomesPrefix,
		"--run", run[1], "--event", "bad-00", "--reason", "re-sent as version 2 by hand")
	require.Equal(t, 0, code, errOut)
	_, report, _ = b.cli(t, "dlq", "report", "--outcomes", redisURL, "--outcomes-table", outcomesPrefix, "--run", run[1])
	require.Contains(t, report, "40 processed, 5 poisoned, 1 compensated")
	t.Logf("sluice dlq report --outcomes redis://…:\n%s", report)

	code, _, errOut = b.cli(t, "dlq", "report", "--outcomes", redisURL, "--outcomes-table", outcomesPrefix, "--run", run[1]+"x")
	require.Equal(t, 1, code, "a mistyped run id does not pass the confirm step")
	require.Contains(t, errOut, "no outcome records of run")
	code, _, errOut = b.cli(t, "dlq", "report", "--outcomes", "redis://:Secret9@127.0.0.1:1/0")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "connection refused")
	require.NotContains(t, errOut, "Secret9")
}

// cancelAfterPublish publishes through the real publisher, then cancels:
// an operator's Ctrl-C landing just after a confirm, which no timing of a
// real signal hits reliably.
type cancelAfterPublish struct {
	pub    dlq.Publisher
	cancel context.CancelFunc
}

func (c cancelAfterPublish) Publish(topic string, msgs ...*message.Message) error {
	err := c.pub.Publish(topic, msgs...)
	c.cancel()
	return err
}

// An interrupt right after a row's publish is confirmed still marks the row
// restored: the rerun restores the others, and no event is published twice.
func TestRestoreInterruptedAfterAConfirm(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	db := testenv.Postgres(t)
	table := testenv.Schema(t, db) + ".sluice_archive"
	code, _, errOut := b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--class", "exhausted", "--to-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	require.Len(t, ids(t, b.topo.Config().PoisonQueue), 3, "the others, drained")

	ctx, cancel := context.WithCancel(t.Context())
	src, err := dlq.OpenTableSource(ctx, db, table, "tester", nil)
	require.NoError(t, err)
	res, err := dlq.Restore(ctx, dlq.Config{Publisher: cancelAfterPublish{b.pub, cancel}}, dlq.RestoreConfig{Source: src})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, res.Replayed)
	require.NoError(t, src.Close())
	var marked int
	require.NoError(t, db.Get(&marked, `SELECT count(*) FROM `+table+` WHERE restored_at IS NOT NULL`))
	require.Equal(t, 1, marked, "the row published before the interrupt is marked")

	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	require.ElementsMatch(t, []string{"e2", "e4", "e6"}, ids(t, b.topo.Config().PoisonQueue), "each once")
}

// A payload at its limit through an archive table: 4 MiB of binary (not
// UTF-8, so kept as base64 in the record) with an event id of 400 bytes
// comes back from restore --from-table byte for byte.
func TestArchiveTableKeepsALargeBinaryPayload(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	body := make([]byte, 4<<20)
	for i := range body {
		body[i] = byte(i*7 + i>>9) // every byte value, no UTF-8
	}
	id := "evt-" + strings.Repeat("é", 198)
	mw, err := poison.New(poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue})
	require.NoError(t, err)
	m := message.NewMessage(watermill.NewUUID(), body)
	m.Metadata.Set(sluice.EventIDKey, id)
	_, err = mw(func(*message.Message) ([]*message.Message, error) { return nil, sluice.Poison(errors.New("bad")) })(m)
	require.NoError(t, err)

	db := testenv.Postgres(t)
	table := testenv.Schema(t, db) + ".sluice_archive"
	code, _, errOut := b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	var eventID string
	require.NoError(t, db.Get(&eventID, `SELECT event_id FROM `+table))
	require.Equal(t, id, eventID)
	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	got := testenv.Drain(t, testenv.AMQP(t), b.topo.Config().PoisonQueue)
	require.Len(t, got, 1)
	require.True(t, bytes.Equal(body, got[0].Body), "the body byte for byte")
	require.Equal(t, id, got[0].Headers[sluice.EventIDKey])
}
