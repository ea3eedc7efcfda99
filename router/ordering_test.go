package router_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// orderScenario is the scenario of TestOrderPerKeyThroughRetries: keys ×
// perKey messages published in order, interleaved; seq%7 == 3 fails once,
// seq%11 == 5 twice (Transient, to the tiers); the poisoned key's message
// poisonSeq is poison.
type orderScenario struct {
	keys, perKey int
	poisonKey    string
	poisonSeq    int
}

func (s orderScenario) failures(seq, attempt int) error {
	switch {
	case seq%7 == 3 && attempt < 2, seq%11 == 5 && attempt < 3:
		return sluice.Transient(fmt.Errorf("seq %d attempt %d: %w", seq, attempt, context.DeadlineExceeded))
	}
	return nil
}

// TestOrderPerKeyThroughRetries runs 20 keys × 20 messages through the
// whole stack on RabbitMQ and PostgreSQL with Stages.Order: a tenth of the
// messages fail once or twice (back from a retry tier later), one key's
// message is poison. For every other key the committed effects are the
// publish order, each once; the poisoned key applied exactly what came
// before its head and holds the rest, which ordering.Skip releases in
// order. Without Stages.Order the same run applies some key out of order
// (the control: the test can fail).
func TestOrderPerKeyThroughRetries(t *testing.T) {
	t.Parallel()
	sc := orderScenario{keys: 20, perKey: 20, poisonKey: "k-07", poisonSeq: 5}
	t.Run("ordered", func(t *testing.T) {
		t.Parallel()
		applied, store, consumer, wait := runOrderScenario(t, sc, true)
		for k := range sc.keys {
			key := fmt.Sprintf("k-%02d", k)
			if key == sc.poisonKey {
				continue
			}
			require.Equal(t, seqs(0, sc.perKey), applied(key), "key %s: the effects in publish order, each once", key)
		}
		require.Equal(t, seqs(0, sc.poisonSeq), applied(sc.poisonKey), "the poisoned key applied what came before its head, and nothing after")
		var keys []ordering.Key
		wait(func() bool {
			var err error
			keys, err = store.Keys(t.Context(), consumer, 10)
			require.NoError(t, err)
			return len(keys) == 1 && keys[0].Held == sc.perKey-sc.poisonSeq-1
		})
		require.Equal(t, sc.poisonKey, keys[0].Key)
		require.True(t, keys[0].Poisoned)
		require.Equal(t, sc.perKey-sc.poisonSeq-1, keys[0].Held, "the poisoned key holds every message after its head")

		head, skipped, err := ordering.Skip(t.Context(), store, consumer, sc.poisonKey)
		require.NoError(t, err)
		require.True(t, skipped)
		require.Equal(t, fmt.Sprintf("%s-%d", sc.poisonKey, sc.poisonSeq), head.Head)
		wait(func() bool { return len(applied(sc.poisonKey)) == sc.perKey-1 })
		require.Equal(t, append(seqs(0, sc.poisonSeq), seqs(sc.poisonSeq+1, sc.perKey)...), applied(sc.poisonKey),
			"after the skip, the held messages in order")
		wait(func() bool { // the release's last commit follows its last effect's
			stats, err := store.Stats(t.Context(), consumer)
			require.NoError(t, err)
			return stats == ordering.Stats{}
		})
	})
	t.Run("ordered over 4 partitions (a handler per partition, single active consumer)", func(t *testing.T) {
		t.Parallel()
		applied, store, consumer, wait := runOrderScenarioOn(t, sc, true, 4)
		for k := range sc.keys {
			key := fmt.Sprintf("k-%02d", k)
			if key != sc.poisonKey {
				require.Equal(t, seqs(0, sc.perKey), applied(key), "key %s: the effects in publish order, each once", key)
			}
		}
		require.Equal(t, seqs(0, sc.poisonSeq), applied(sc.poisonKey))
		// The poisoned key waits in its partition's handler ("ledger-p<i>").
		var holder string
		wait(func() bool {
			for i := range 4 {
				keys, err := store.Keys(t.Context(), fmt.Sprintf("%s-p%d", consumer, i), 10)
				require.NoError(t, err)
				if len(keys) == 1 && keys[0].Key == sc.poisonKey && keys[0].Held == sc.perKey-sc.poisonSeq-1 {
					holder = fmt.Sprintf("%s-p%d", consumer, i)
					return true
				}
			}
			return false
		})
		_, skipped, err := ordering.Skip(t.Context(), store, holder, sc.poisonKey)
		require.NoError(t, err)
		require.True(t, skipped)
		wait(func() bool { return len(applied(sc.poisonKey)) == sc.perKey-1 })
		require.Equal(t, append(seqs(0, sc.poisonSeq), seqs(sc.poisonSeq+1, sc.perKey)...), applied(sc.poisonKey))
	})
	t.Run("control: without Stages.Order a retried message applies after its key's later ones", func(t *testing.T) {
		t.Parallel()
		applied, _, _, _ := runOrderScenario(t, sc, false)
		outOfOrder := 0
		for k := range sc.keys {
			if got := applied(fmt.Sprintf("k-%02d", k)); !slices.IsSorted(got) {
				outOfOrder++
			}
		}
		require.Positive(t, outOfOrder, "the scenario retries messages: without the stage their keys apply out of order")
	})
}

func seqs(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// runOrderScenario publishes sc and waits until every message that can be
// applied is; it returns the applied sequence of a key (in commit order),
// the ordering store, the consumer and a bounded wait.
func runOrderScenario(t *testing.T, sc orderScenario, ordered bool) (applied func(key string) []int, store ordering.Store, consumer string, wait func(func() bool)) {
	return runOrderScenarioOn(t, sc, ordered, 0)
}

// runOrderScenarioOn is runOrderScenario on a topology of partitions
// partition queues (0: one queue), published through the partitioned
// broker's exchange, the ordering key the partition key.
func runOrderScenarioOn(t *testing.T, sc orderScenario, ordered bool, partitions int) (applied func(key string) []int, store ordering.Store, consumer string, wait func(func() bool)) {
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s.applied (n bigserial PRIMARY KEY, order_key text NOT NULL, seq int NOT NULL)`, schema))
	require.NoError(t, err)
	inbox, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)
	require.NoError(t, inbox.CreateTable(t.Context()))
	store = testenv.Migrate(t, db, sluicesql.Config{Schema: schema, Order: sluicesql.OrdersConfig{TablePrefix: "order"}}).Order

	queue := testenv.Name("ordered")
	tc := rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}}
	if partitions > 0 {
		tc.Partitions, tc.PartitionKey = partitions, "account"
	}
	topo, err := rabbitmq.NewTopology(tc)
	require.NoError(t, err)
	var queues []string
	for _, q := range topo.Queues() {
		queues = append(queues, q.Name)
	}
	if partitions > 0 {
		testenv.DeleteQueuesAtEnd(t, "exchange:"+topo.Config().Exchange)
	}
	testenv.DeleteQueuesAtEnd(t, queues...)
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: tc})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	publish := func(m *message.Message) error { return b.Publisher().Publish(queue, m) }
	if partitions > 0 {
		publish = func(m *message.Message) error { return b.PartitionPublisher().Publish(topo.Config().Exchange, m) }
	}

	consumer = "ledger"
	stages := router.Stages{
		Poison:    &poison.Config{},
		Retry:     &retrytiers.Config{},
		Classify:  &stage.ClassifyConfig{},
		Inbox:     &deduplication.Config{Store: inbox},
		Recoverer: &stage.RecovererConfig{},
	}
	if ordered {
		stages.Order = &ordering.Config{Store: store, Key: sluice.KeyFromMetadata("account"), ResumeInterval: 100 * time.Millisecond}
	}
	var poisoned atomic.Int64
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b,
		Name:   consumer,
		Handler: func(msg *message.Message) error {
			key := msg.Metadata.Get("account")
			var seq int
			if _, err := fmt.Sscan(msg.Metadata.Get("seq"), &seq); err != nil {
				return sluice.Poison(err)
			}
			attempt, err := sluice.Attempt(msg)
			if err != nil {
				return err
			}
			if key == sc.poisonKey && seq == sc.poisonSeq {
				poisoned.Add(1)
				return sluice.Poison(errors.New("unknown account version"))
			}
			if err := sc.failures(seq, attempt); err != nil {
				return err
			}
			_, err = sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
				fmt.Sprintf(`INSERT INTO %s.applied (order_key, seq) VALUES ($1, $2)`, schema), key, seq)
			return err
		},
		Stages: stages,
	})
	require.NoError(t, err)
	publishAll := func() {
		for seq := range sc.perKey {
			for k := range sc.keys {
				key := fmt.Sprintf("k-%02d", k)
				m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("%s-%d", key, seq))
				m.Metadata.Set("account", key)
				m.Metadata.Set("seq", fmt.Sprint(seq))
				require.NoError(t, publish(m))
			}
		}
	}
	// The control's messages are all in the queue before the consumer
	// starts: a copy back from a tier goes behind its key's later ones
	// (published beside the consumer, under load in make test each copy
	// came back before its key's next message was published, and the
	// control found no key out of order).
	if !ordered {
		publishAll()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	<-r.Running()
	if ordered {
		publishAll()
	}
	applied = func(key string) []int {
		var s []int
		require.NoError(t, db.Select(&s, fmt.Sprintf(`SELECT seq FROM %s.applied WHERE order_key = $1 ORDER BY n`, schema), key))
		return s
	}
	wait = func(cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, 5*time.Minute, 50*time.Millisecond) // a liveness bound
	}
	want := sc.keys*sc.perKey - 1 // the poisoned head
	if ordered {
		want = sc.keys*sc.perKey - (sc.perKey - sc.poisonSeq) // the head and what its key holds
	}
	// 400 messages through the tiers took over 90 s at load average 25:
	// waited for while they move.
	if err := testenv.AwaitCount(want, 5*time.Minute, 10*time.Minute, func() int {
		var n int
		require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %s.applied`, schema)))
		return n
	}); err != nil {
		t.Fatalf("every message that can be applied applied: %v; %s", err, testenv.QueueDepths(t, testenv.AMQP(t), queues...))
	}
	wait(func() bool { return poisoned.Load() >= 1 })
	return applied, store, consumer, wait
}
