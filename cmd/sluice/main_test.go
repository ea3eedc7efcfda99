package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(closingShared{m}) }

// bed is a consumer queue with its topology, and a poison queue filled by the
// real poison stage.
type bed struct {
	url   string // the broker's
	topo  *rabbitmq.Topology
	audit string
	pub   *rabbitmq.Publisher
}

func newBed(t testing.TB) *bed {
	t.Helper()
	return newBedOn(t, rabbitmq.TopologyConfig{Queue: testenv.Name("cli"), TierDelays: []time.Duration{time.Minute}})
}

// newBedOn is a bed on the topology of cfg (its one tier of a minute).
func newBedOn(t testing.TB, cfg rabbitmq.TopologyConfig) *bed {
	t.Helper()
	q := cfg.Queue
	testenv.DeleteQueuesAtEnd(t, q, q+".poison", q+".retry.1m")
	return newBedAt(t, testenv.AMQPURL, cfg)
}

// newBedAt is newBedOn on the broker at url, whose queues are left to it
// (a private node's vhost goes with them).
func newBedAt(t testing.TB, url string, cfg rabbitmq.TopologyConfig) *bed {
	t.Helper()
	topo, err := rabbitmq.NewTopology(cfg)
	require.NoError(t, err)
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, err = topo.Declare(t.Context(), conn)
	require.NoError(t, err)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return &bed{url: url, topo: topo, audit: filepath.Join(t.TempDir(), "audit.jsonl"), pub: pub}
}

// poisoned isolates one event through the poison stage.
func (b *bed) poisoned(t *testing.T, id, eventType string, err error) {
	t.Helper()
	mw, e := poison.New(poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue})
	require.NoError(t, e)
	m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"eventId":%q}`, id))
	m.Metadata.Set(sluice.EventIDKey, id)
	m.Metadata.Set(sluice.EventTypeKey, eventType)
	m.Metadata.Set(sluice.AttemptKey, "4")
	_, e = mw(func(*message.Message) ([]*message.Message, error) { return nil, err })(m)
	require.NoError(t, e)
}

// fill poisons e1..e6: poison, exhausted, invariant, exhausted, poison, exhausted.
func (b *bed) fill(t *testing.T) {
	t.Helper()
	for i, c := range []error{
		sluice.Poison(errors.New(`missing field "sku"`)),
		sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout after 4 attempts")),
		sluice.Invariant(errors.New("order o-17 must exist")),
		sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout after 4 attempts")),
		sluice.Poison(errors.New(`missing field "qty"`)),
		sluice.NewFailure(sluice.ClassExhausted, errors.New("connection refused")),
	} {
		et := "order.created"
		if i == 4 {
			et = "order.cancelled"
		}
		b.poisoned(t, fmt.Sprint("e", i+1), et, c)
	}
}

// outcomeWait is --wait for a replay whose outcomes all come: the wait ends
// as soon as they are in, so it can be long. 30 s was once too short for a
// batch of 105 events through the whole stack (one PostgreSQL commit each)
// while CI ran every package at once.
const outcomeWait = "3m"

func (b *bed) cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(append([]string{"--amqp-url", cmp.Or(b.url, testenv.AMQPURL), "--audit", b.audit, "--operator", "tester"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// ids drains a queue and returns its event ids in order.
func ids(t *testing.T, queue string) []string {
	t.Helper()
	var out []string
	for _, d := range testenv.Drain(t, testenv.AMQP(t), queue) {
		out = append(out, fmt.Sprint(d.Headers[sluice.EventIDKey]))
	}
	return out
}

// peekIDs reads a queue's event ids without removing anything.
func peekIDs(t *testing.T, queue string) []string {
	t.Helper()
	ms, err := dlq.Open(testenv.AMQP(t), queue, dlq.Config{}).Inspect(t.Context(), dlq.Filter{}, 0)
	require.NoError(t, err)
	var out []string
	for _, m := range ms {
		out = append(out, m.EventID)
	}
	return out
}

func (b *bed) auditLines(t *testing.T) []dlq.AuditRecord {
	t.Helper()
	f, err := os.Open(b.audit)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	var recs []dlq.AuditRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r dlq.AuditRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		recs = append(recs, r)
	}
	return recs
}

func TestReplayByFilterMovesExactlyTheSelected(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)

	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--class", "exhausted", "--batch", "2")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "selected")
	require.Contains(t, out, "replayed 2 (the queue held 6 at the start)", "the progress knows its total")
	require.Equal(t, []string{"e1", "e3", "e5"}, peekIDs(t, b.topo.Config().PoisonQueue), "the rest stays, in order")

	replayed := testenv.Drain(t, testenv.AMQP(t), b.topo.Config().Queue)
	require.Len(t, replayed, 3)
	for i, d := range replayed {
		require.Equal(t, []string{"e2", "e4", "e6"}[i], d.Headers[sluice.EventIDKey])
		require.Nil(t, d.Headers[sluice.AttemptKey], "the attempt count is reset")
		require.Nil(t, d.Headers[metakeys.PoisonClass], "the failure history is not replayed")
		require.Equal(t, "tester", d.Headers[metakeys.ReplayedBy])
		require.Equal(t, b.topo.Config().PoisonQueue, d.Headers[metakeys.ReplayedFrom])
		require.Equal(t, "exhausted", d.Headers[metakeys.ReplayedClass])
		require.Equal(t, "1", d.Headers[metakeys.ReplayCount])
		require.NotEmpty(t, d.Headers[metakeys.ReplayedAt])
	}

	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--error-match", `"sku"`)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--event-type", "order.cancelled")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"e1", "e5"}, ids(t, b.topo.Config().Queue))
	require.Equal(t, []string{"e3"}, peekIDs(t, b.topo.Config().PoisonQueue))

	recs := b.auditLines(t)
	require.Len(t, recs, 3)
	require.Equal(t, "dlq replay", recs[0].Command)
	require.Equal(t, "tester", recs[0].Operator)
	require.Equal(t, map[string]string{"class": "exhausted"}, recs[0].Filters)
	require.Equal(t, 3, recs[0].Result.Replayed)
	require.Equal(t, "ok", recs[0].Outcome)
}

func TestReplayDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "dry run: nothing changed")
	require.Equal(t, []string{"e1", "e2", "e3", "e4", "e5", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue))
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().Queue))
	recs := b.auditLines(t)
	require.Equal(t, "dry-run", recs[0].Outcome)
	require.Equal(t, 6, recs[0].Result.Selected)
	require.Zero(t, recs[0].Result.Replayed)
	require.Len(t, recs[0].Result.Plan, 6, "each selected message with its target")
	require.Equal(t, dlq.Planned{Message: "event e1", Target: b.topo.Config().Queue}, recs[0].Result.Plan[0])
	require.Contains(t, out, "event e6")

	// The dry run checks each target and names the message that has none,
	// or whose target does not exist: the real run would fail on it.
	m := message.NewMessage("no-headers-uuid", []byte("{}"))
	require.NoError(t, b.pub.Publish(b.topo.Config().PoisonQueue, m))
	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--dry-run")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "dead letter no-headers-uuid")
	require.Contains(t, errOut, "no sluice_poison_queue")
	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--dry-run", "--to", testenv.Name("missing"))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "event e1: target queue")
	require.Contains(t, errOut, "does not exist")
	require.Equal(t, 7, testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().PoisonQueue), "nothing moved")
}

func TestReplayRate(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	for i := range 12 {
		b.poisoned(t, fmt.Sprint("r", i), "order.created", sluice.Poison(errors.New("bad")))
	}
	start := time.Now()
	code, _, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--rate", "20/s", "--batch", "1")
	require.Equal(t, 0, code, errOut)
	// 12 messages at 20/s with a burst of 1: at least 11/20 s.
	require.GreaterOrEqual(t, time.Since(start), 550*time.Millisecond, "--rate is honoured")
	require.Equal(t, 12, testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().Queue))
}

func TestReplayPublishFailureStopsWithTheMessageKept(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	code, _, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--to", testenv.Name("no_such_queue"), "--batch", "1")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "unroutable")
	require.Equal(t, []string{"e1", "e2", "e3", "e4", "e5", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue), "nothing removed")
	require.Equal(t, "error", b.auditLines(t)[0].Outcome)

	// Mid-run: the target disappears after two messages.
	other := testenv.Name("target")
	ch := testenv.Channel(t, testenv.AMQP(t))
	_, err := ch.QueueDeclare(other, true, false, false, false, nil)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, other)
	code, _, _ = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--to", other, "--limit", "2", "--batch", "1")
	require.Equal(t, 0, code)
	_, err = ch.QueueDelete(other, false, false, false)
	require.NoError(t, err)
	code, _, _ = b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--to", other, "--batch", "1")
	require.Equal(t, 1, code)
	require.Equal(t, []string{"e3", "e4", "e5", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue), "the failed message and the rest stay")
}

func TestArchive(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	file := filepath.Join(t.TempDir(), "archive.jsonl")

	// An archive that cannot be written removes nothing.
	code, _, errOut := b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to", filepath.Join(t.TempDir(), "missing", "a.jsonl"))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "opening the archive")
	require.Len(t, peekIDs(t, b.topo.Config().PoisonQueue), 6)

	code, _, errOut = b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--class", "poison", "--to", file)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"e2", "e3", "e4", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue))
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 2)
	var rec dlq.ArchiveRecord
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &rec))
	require.Equal(t, "e1", rec.EventID)
	require.Equal(t, "poison", rec.Class)
	require.JSONEq(t, `{"eventId":"e1"}`, rec.Payload)
	require.Equal(t, "tester", rec.ArchivedBy)
	require.Equal(t, "dlq archive", b.auditLines(t)[1].Command)
}

func TestStatsAndInspectRemoveNothing(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	code, out, errOut := b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "6 messages")
	require.Contains(t, out, "timeout after # attempts")
	require.Contains(t, out, "order o-# must exist")

	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--class", "exhausted")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "3 of 6 messages match the filter (3 skipped)", "a filter says what it left out")
	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--since", "1s", "--until", "1s")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0 of 6 messages match the filter (6 skipped)", "not \"0 messages\" for a full queue")

	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--json")
	require.Equal(t, 0, code, errOut)
	var s dlq.Stats
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.Equal(t, map[string]int{"poison": 2, "exhausted": 3, "invariant": 1}, s.ByClass)
	require.Equal(t, 2, s.ByFingerprint["exhausted: timeout after # attempts"])
	require.Equal(t, map[string]int{"order.created": 5, "order.cancelled": 1}, s.ByEventType)
	require.False(t, s.Oldest.IsZero())

	code, out, errOut = b.cli(t, "dlq", "inspect", "--queue", b.topo.Config().PoisonQueue, "--class", "invariant")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "order o-17 must exist")
	require.Contains(t, out, `{"eventId":"e3"}`)
	require.Contains(t, out, "1 messages shown")
	require.Equal(t, []string{"e1", "e2", "e3", "e4", "e5", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue), "nothing removed, the order kept")
}

// Replayed messages reach a consumer running the Sluice stack, whose inbox
// drops the ones already processed.
func TestReplayIntoTheStackInboxDropsProcessed(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	store := deduplication.NewMemoryStore()
	var mu sync.Mutex
	handled := map[string]int{}
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: b.topo.Config().Queue, TierDelays: []time.Duration{time.Minute}}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "inventory", Consumers: 1,
		Handler: func(msg *message.Message) error {
			mu.Lock()
			handled[msg.Metadata.Get(sluice.EventIDKey)]++
			mu.Unlock()
			return nil
		},
		Stages: router.Stages{Classify: &stage.ClassifyConfig{}, Inbox: &deduplication.Config{Store: store, Consumer: "inventory"}},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done); require.NoError(t, q.Close()) })

	// e1 was processed before; a duplicate of it was poisoned anyway (e.g. a
	// crash between a tier's confirm and the ack). e2 was not.
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(sluice.EventIDKey, "e1")
	require.NoError(t, b.pub.Publish(b.topo.Config().Queue, m))
	require.Eventually(t, func() bool { return store.Len() == 1 }, time.Minute, 10*time.Millisecond)
	b.poisoned(t, "e1", "order.created", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))
	b.poisoned(t, "e2", "order.created", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))

	code, _, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue)
	require.Equal(t, 0, code, errOut)
	require.Eventually(t, func() bool { return store.Len() == 2 }, time.Minute, 10*time.Millisecond)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().Queue) == 0 }, time.Minute, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"e1": 1, "e2": 1}, handled, "the replayed e1 was dropped by the inbox")
}

func TestUsageAndErrors(t *testing.T) {
	t.Parallel()
	auditFile := filepath.Join(t.TempDir(), "audit.jsonl")
	run := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	for _, args := range [][]string{
		{"dlq", "replay"},
		{"dlq", "replay", "--queue", "q", "--class", "transient"},
		{"dlq", "replay", "--queue", "q", "--rate", "fast"},
		{"dlq", "inspect", "--queue", "q", "--since", "yesterday"},
		{"dlq", "stats", "--nope"},
		{"dlq", "archive", "--queue", "q"},
		{"topology", "plan", "--queue", "amq.bad"},
		{"topology", "plan"},
	} {
		code, out := run(append([]string{"--audit", auditFile}, args...)...)
		require.Equal(t, 2, code, "%v: %s", args, out)
	}
	require.NoFileExists(t, auditFile, "a usage error touches nothing, not even the audit log")
	code, out := run("--amqp-url", "amqp://admin:s3cret@127.0.0.1:1/", "dlq", "stats", "--queue", "q")
	require.Equal(t, 1, code)
	require.Contains(t, out, "amqp://admin:xxxxx@127.0.0.1:1/")
	require.NotContains(t, out, "s3cret")

	code, out = run("--amqp-url", testenv.AMQPURL, "dlq", "stats", "--queue", testenv.Name("missing"))
	require.Equal(t, 1, code)
	require.Contains(t, out, "queue does not exist")

	// A cluster's nodes, comma-separated: a dead first node is passed over,
	// and when none answers each is named, with no password.
	code, out = run("--amqp-url", "amqp://admin:s3cret@127.0.0.1:1/, "+testenv.AMQPURL, "dlq", "stats", "--queue", testenv.Name("missing"))
	require.Equal(t, 1, code)
	require.Contains(t, out, "queue does not exist", "reached the second node")
	code, out = run("--amqp-url", "amqp://admin:s3cret@127.0.0.1:1/,amqp://admin:s3cret@127.0.0.1:2/", "dlq", "stats", "--queue", "q")
	require.Equal(t, 1, code)
	require.Contains(t, out, "no node of 2 answered")
	require.Contains(t, out, "amqp://admin:xxxxx@127.0.0.1:2/")
	require.NotContains(t, out, "s3cret")

	// A mistyped subcommand is named, with a suggestion, not hidden behind
	// "unknown flag: --queue".
	code, out = run("dlq", "replya", "--queue", "q")
	require.Equal(t, 2, code)
	require.Contains(t, out, `unknown command "replya" for "sluice dlq"`)
	require.Contains(t, out, "Did you mean this?\n\treplay")
	code, out = run("--version")
	require.Equal(t, 0, code)
	require.Contains(t, out, "sluice version ")
}

func TestTopologyPlanAndApply(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	q := testenv.Name("topo")
	require.Equal(t, 0, run([]string{"topology", "plan", "--queue", q, "--tiers", "1s,2s", "--quorum", "--delivery-limit", "5"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), q+`.retry.1s {"x-dead-letter-exchange":"","x-dead-letter-routing-key":"`+q+`"`)
	require.Contains(t, out.String(), `"x-delivery-limit":5`)
	require.Contains(t, out.String(), "rabbitmqctl set_policy")

	testenv.DeleteQueuesAtEnd(t, q, q+".poison", q+".retry.1s", q+".retry.2s")
	out.Reset()
	require.Equal(t, 0, run([]string{"--amqp-url", testenv.AMQPURL, "topology", "apply", "--queue", q, "--tiers", "1s,2s"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "declared "+q+".poison")
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), q+".retry.2s"))

	out.Reset()
	require.Equal(t, 0, run([]string{"topology", "plan", "--queue", q, "--tiers", "30s,5m", "--tier-jitter", "0.2"}, &out, &errOut), errOut.String())
	for _, wait := range []string{"30s", "28s", "26s", "24s", "5m", "4m40s", "4m20s", "4m"} {
		require.Contains(t, out.String(), q+".retry."+wait+" {", "a queue per wait of each tier")
	}
	require.Contains(t, out.String(), `"x-message-ttl":280000`)
	require.Equal(t, 2, run([]string{"topology", "plan", "--queue", q, "--tier-jitter", "0.9"}, &out, &errOut))
	require.Contains(t, errOut.String(), "TierJitter")
}

// A foreign producer's gzip payload, poisoned and replayed: the replay
// carries every AMQP property, content_encoding first of all, byte for byte.
func TestReplayKeepsTheProducersProperties(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	conn := testenv.AMQP(t)
	pub := foreignPoisoned(t, b, "g-1")

	code, _, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue)
	require.Equal(t, 0, code, errOut)
	replayed := testenv.Drain(t, conn, b.topo.Config().Queue)
	require.Len(t, replayed, 1)
	r := replayed[0]
	require.Equal(t, pub.Body, r.Body)
	require.Equal(t, pub.ContentEncoding, r.ContentEncoding)
	require.Equal(t, pub.ContentType, r.ContentType)
	require.Equal(t, pub.CorrelationId, r.CorrelationId)
	require.Equal(t, pub.MessageId, r.MessageId)
	require.Equal(t, pub.Type, r.Type)
	require.Equal(t, pub.AppId, r.AppId)
	require.Equal(t, pub.ReplyTo, r.ReplyTo)
	require.Equal(t, pub.Priority, r.Priority)
	require.True(t, pub.Timestamp.Equal(r.Timestamp))
	require.Equal(t, "com.example.OrderCreated", r.Headers["__TypeId__"])
}

// The CLI reaches a broker behind TLS with --tls-ca, and says what is wrong
// with a bad TLS flag.
func TestCLIOverTLS(t *testing.T) {
	t.Parallel()
	node, caPEM := privateNode(t)
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: node.URL}, "")
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("orders.poison", true, false, false, false, nil)
	require.NoError(t, err)

	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, caPEM, 0o600))
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(append([]string{"--amqp-url", node.TLSURL, "--audit", "-"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := run("--tls-ca", ca, "dlq", "stats", "--queue", "orders.poison")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0")
	code, _, errOut = run("dlq", "stats", "--queue", "orders.poison")
	require.Equal(t, 1, code, "without the CA the broker's certificate is refused")
	require.Contains(t, errOut, "certificate")
	code, _, errOut = run("--tls-ca", filepath.Join(t.TempDir(), "missing.pem"), "dlq", "stats", "--queue", "orders.poison")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--tls-ca")
	code, _, errOut = run("--tls-cert", ca, "dlq", "stats", "--queue", "orders.poison")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--tls-cert and --tls-key go together")
}

// Message contents are hostile: escape sequences (window title, clear
// screen, a C1 CSI, a bidi override), a 100 KB header, a binary body. What
// stats and inspect print has no control byte but newlines, bounded cells,
// and inspect --json keeps a binary body losslessly.
func TestHostileContentsAreEscapedAndBounded(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mw, err := poison.New(poison.Config{Publisher: b.pub, Topic: b.topo.Config().PoisonQueue, Queue: b.topo.Config().Queue})
	require.NoError(t, err)
	body := []byte("\x1b[2J\xff\xfe binary \x00")
	m := message.NewMessage(watermill.NewUUID(), body)
	m.Metadata.Set(sluice.EventIDKey, "evt-\x1b]0;pwned\x07")
	m.Metadata.Set(sluice.EventTypeKey, "type-\u202eevil"+strings.Repeat("x", 100_000))
	_, err = mw(func(*message.Message) ([]*message.Message, error) {
		return nil, sluice.Poison(errors.New("bad \x1b[31mred\x1b[0m \x9b2J"))
	})(m)
	require.NoError(t, err)

	for _, args := range [][]string{{"dlq", "stats", "--queue", b.topo.Config().PoisonQueue}, {"dlq", "inspect", "--queue", b.topo.Config().PoisonQueue}} {
		code, out, errOut := b.cli(t, args...)
		require.Equal(t, 0, code, errOut)
		for _, r := range out {
			require.False(t, r < 0x20 && r != '\n' || r == 0x7f || r >= 0x80 && r <= 0x9f || r >= 0x202a && r <= 0x202e,
				"%v printed the control character %U", args, r)
		}
		require.Contains(t, out, `\x1b`, "escaped, not dropped")
		require.Less(t, len(out), 8_000, "%v: bounded, not 100 KB", args)
	}
	code, out, errOut := b.cli(t, "dlq", "inspect", "--queue", b.topo.Config().PoisonQueue, "--json")
	require.Equal(t, 0, code, errOut)
	var recs []map[string]any // JSON lines, streamed
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		recs = append(recs, rec)
	}
	require.Len(t, recs, 1)
	raw, err := base64.StdEncoding.DecodeString(recs[0]["payload_base64"].(string))
	require.NoError(t, err)
	require.Equal(t, body, raw, "the binary body, byte for byte")
}

// An audit log that cannot be written is found before anything moves:
// archive and replay fail and the poison queue keeps every message.
func TestUnwritableAuditLogMovesNothing(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	b.audit = filepath.Join(t.TempDir(), "missing-dir", "audit.jsonl")
	for _, args := range [][]string{
		{"dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to", filepath.Join(t.TempDir(), "archive.jsonl")},
		{"dlq", "replay", "--queue", b.topo.Config().PoisonQueue},
	} {
		code, _, errOut := b.cli(t, args...)
		require.Equal(t, 1, code, "%v", args)
		require.Contains(t, errOut, "the audit log cannot be written, nothing was moved")
		require.Equal(t, 6, testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().PoisonQueue), "%v moved nothing", args)
	}
}
