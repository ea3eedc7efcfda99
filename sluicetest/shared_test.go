package sluicetest_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/poisonqueue"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicetest"
)

// scenario is one row of the shared table: what a test does, and the
// outcome trace of each subject it publishes.
type scenario struct {
	name string
	run  func(h *sluicetest.Harness, id string)
	want map[string][]string // subject (prefixed by the scenario's id) → outcomes
}

// table is the scenario table both backends run: the kit and RabbitMQ with
// PostgreSQL. Each scenario publishes with event ids of its own.
var table = []scenario{
	{"processed", func(h *sluicetest.Harness, id string) {
		h.Publish(id, pay(id, payment{}))
	}, map[string][]string{"": {"processed, produced receipt:processed"}}},
	{"duplicate", func(h *sluicetest.Harness, id string) {
		h.Publish(id, pay(id, payment{}))
		h.Settle()
		h.Redeliver(id, id+" again")
	}, map[string][]string{"": {"processed, produced receipt:duplicate"}, " again": {"duplicate"}}},
	{"rejected", func(h *sluicetest.Harness, id string) {
		h.Publish(id, pay(id, payment{Fail: "reject"}))
	}, map[string][]string{"": {"rejected"}}},
	{"recovers in tier 2", func(h *sluicetest.Harness, id string) {
		h.Publish(id, pay(id, payment{Fail: "transient", Attempts: 2}))
	}, map[string][]string{"": {"retried to tier 1", "retried to tier 2", "processed, produced receipt:recovers in tier 2"}}},
	{"exhausted", func(h *sluicetest.Harness, id string) {
		h.Publish(id, pay(id, payment{Fail: "transient", Attempts: 99}))
	}, map[string][]string{"": {"retried to tier 1", "retried to tier 2", "retried to tier 3", "poisoned (exhausted)"}}},
	{"malformed", func(h *sluicetest.Harness, id string) {
		h.Publish(id, sluicetest.Message(id, []byte(`{"fail":`)))
	}, map[string][]string{"": {"poisoned (poison)"}}},
	{"panics", func(h *sluicetest.Harness, id string) {
		h.Publish(id, pay(id, payment{Fail: "panic"}))
	}, map[string][]string{"": {"poisoned (invariant)"}}},
	{"crash before the ack", func(h *sluicetest.Harness, id string) {
		h.CrashAfterCommit(1)
		h.Publish(id, pay(id, payment{}))
	}, map[string][]string{"": {"processed, produced receipt:crash before the ack, crashed before the ack", "duplicate"}}},
	{"the poison queue nacks", func(h *sluicetest.Harness, id string) {
		h.FailPublishes(sluicetest.ToPoison, 1, sluicetest.ErrNacked)
		h.Publish(id, sluicetest.Message(id, []byte(`{"fail":`)))
	}, map[string][]string{"": {"parked", "poisoned (poison)"}}},
}

// runTable runs the table on h, one scenario after the other, and returns
// every subject's outcomes, with the poison diagnosis's class and reason.
func runTable(t *testing.T, h *sluicetest.Harness) map[string][]string {
	t.Helper()
	for _, sc := range table {
		sc.run(h, sc.name)
		h.Settle()
	}
	got := map[string][]string{}
	for subject, tr := range h.Traces() {
		got[subject] = tr.Outcomes()
		if last := tr.Last(); last.Outcome == sluice.OutcomePoisoned {
			got[subject] = append(got[subject], "diagnosis: "+last.Diagnosis[metakeys.PoisonClass]+": "+last.Diagnosis[metakeys.PoisonReason])
		}
	}
	return got
}

func wantTable() map[string][]string {
	want := map[string][]string{}
	for _, sc := range table {
		for suffix, outcomes := range sc.want {
			want[sc.name+suffix] = outcomes
		}
	}
	return want
}

// withoutDiagnosis returns got without the diagnosis lines, for the
// comparison with the table.
func withoutDiagnosis(got map[string][]string) map[string][]string {
	out := map[string][]string{}
	for k, v := range got {
		out[k] = slices.DeleteFunc(slices.Clone(v), func(s string) bool { return strings.HasPrefix(s, "diagnosis: ") })
	}
	return out
}

// The same scenario table runs on the kit (the default ladder on its
// virtual clock, SQLite) and on RabbitMQ with PostgreSQL (a shortened
// ladder, real time), and the outcome traces — with the poison
// diagnosis's class and reason — are identical: the kit is the same
// stages on a faithful broker, not a second implementation.
func TestTheSharedTableRunsTheSameOnTheKitAndOnRabbitMQ(t *testing.T) {
	t.Parallel()
	kit := runTable(t, newHarness(t, sluicetest.Config{}))
	require.Equal(t, wantTable(), withoutDiagnosis(kit), "the kit's traces")

	queue := testenv.Name("sluicetest")
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}},
	})
	require.NoError(t, err)
	queues := []string{queue, queue + poisonqueue.Suffix}
	for _, tier := range b.Endpoints().Tiers {
		queues = append(queues, tier.Topics()...)
	}
	testenv.DeleteQueuesAtEnd(t, queues...)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	real := runTable(t, newHarness(t, sluicetest.Config{Broker: b, Input: closeless{b.Publisher()}, DB: testenv.PostgresInSchema(t)}))
	require.Equal(t, kit, real, "the traces on RabbitMQ and PostgreSQL are the kit's")
	t.Logf("%d subjects, the same outcomes on both: %v", len(kit), slices.Sorted(maps.Keys(kit)))
}

// closeless is the broker's publisher, which the broker closes.
type closeless struct{ message.Publisher }

func (closeless) Close() error { return nil }
