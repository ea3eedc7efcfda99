package router_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// TestARedeliveryOfAnAppliedMessageBehindAPoisonedHeadIsADuplicate: key a's
// a-0 fails once and goes to a tier (the key waits for it; a-1 and a-2
// are held); back from the tier it succeeds, and its release poisons a-1
// (the new head; a-2 stays held) — then its ack is lost, as when the
// process dies after the commit and before the ack (chaos scenario
// ordered: "after-commit"), and the broker delivers it again. That
// redelivery of a message the key applied is a duplicate: it is not held
// behind a-1 (the key holds a-2 alone), it has no second effect, and after
// ordering.Skip the key applies a-2. Before the fix it was held — the key
// held 2 where 1 waits, what the chaos scenario's check found (10 held
// where 9 were wanted) — and only the inbox's skip at its release kept
// its effect once.
func TestARedeliveryOfAnAppliedMessageBehindAPoisonedHeadIsADuplicate(t *testing.T) {
	t.Parallel()
	db, schema, inbox, store := newOrderedStores(t, "event_id text NOT NULL")

	queue := testenv.Name("ordered_redelivery")
	tc := rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}}
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: tc})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	for _, q := range b.Topology().Queues() {
		testenv.DeleteQueuesAtEnd(t, q.Name)
	}

	const consumer = "ledger"
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	// Outside every stage: a-0's delivery back from its tier loses its ack
	// once, after its commit and its release; its redelivery's outcome is
	// reported.
	// a-0's first run waits until all three are published: a-1 and a-2
	// are in the queue before a-0's copy comes back from its 50 ms tier,
	// so the key holds them both when it does (on a loaded machine the
	// copy came back before a-2 was published, and the key held nothing).
	var runs atomic.Int64
	var entered atomic.Bool
	published := make(chan struct{})
	redelivered := make(chan sluice.Outcome, 1)
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if msg.Metadata.Get(sluice.EventIDKey) != "a-0" {
				return h(msg)
			}
			if entered.CompareAndSwap(false, true) {
				select {
				case <-published:
				case <-msg.Context().Done():
					return nil, msg.Context().Err()
				}
			}
			ctx, report := sluice.WithReport(msg.Context())
			msg.SetContext(ctx)
			out, err := h(msg)
			switch runs.Add(1) {
			case 2: // back from the tier: processed, a-1 released and poisoned
				if err == nil {
					return nil, errors.New("the ack is lost: the broker delivers it again")
				}
			case 3:
				redelivered <- report.Settle(err)
			}
			return out, err
		}
	})
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b,
		Name:   consumer,
		Handler: func(msg *message.Message) error {
			id := msg.Metadata.Get(sluice.EventIDKey)
			attempt, err := sluice.Attempt(msg)
			if err != nil {
				return err
			}
			switch {
			case id == "a-0" && attempt < 2:
				return sluice.Transient(fmt.Errorf("downstream: %w", context.DeadlineExceeded))
			case id == "a-1":
				return sluice.Poison(errors.New("unknown account version"))
			}
			_, err = sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
				fmt.Sprintf(`INSERT INTO %s.applied (event_id) VALUES ($1)`, schema), id)
			return err
		},
		Stages: router.Stages{
			Order:     &ordering.Config{Store: store, Key: sluice.KeyFromMetadata("account"), ResumeInterval: 100 * time.Millisecond},
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: inbox},
			Recoverer: &stage.RecovererConfig{},
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	<-r.Running()
	for seq := range 3 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("a-%d", seq))
		m.Metadata.Set("account", "a")
		require.NoError(t, b.Publisher().Publish(queue, m))
	}
	close(published)

	select {
	case outcome := <-redelivered:
		require.Equal(t, sluice.OutcomeDuplicate, outcome, "the redelivery of a-0, which its key applied, is a duplicate, not held behind a-1")
	case <-time.After(90 * time.Second):
		t.Fatalf("a-0 was not delivered again after its lost ack (%d runs)", runs.Load())
	}
	applied := func() []string {
		var ids []string
		require.NoError(t, db.Select(&ids, fmt.Sprintf(`SELECT event_id FROM %s.applied ORDER BY n`, schema)))
		return ids
	}
	// The redelivery's outcome is settled once its stages returned: the
	// key's state is final.
	keys, err := store.Keys(t.Context(), consumer, 10)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, ordering.Key{Key: "a", Head: "a-1", Poisoned: true, Held: 1}, ordering.Key{Key: keys[0].Key, Head: keys[0].Head, Poisoned: keys[0].Poisoned, Held: keys[0].Held},
		"the key waits for its poisoned head a-1 and holds a-2 alone")
	require.Equal(t, []string{"a-0"}, applied(), "a-0 applied once")

	_, skipped, err := ordering.Skip(t.Context(), store, consumer, "a")
	require.NoError(t, err)
	require.True(t, skipped)
	require.Eventually(t, func() bool {
		stats, err := store.Stats(t.Context(), consumer)
		require.NoError(t, err)
		return len(applied()) == 2 && stats == ordering.Stats{}
	}, 90*time.Second, 50*time.Millisecond, "after the skip the key applies a-2 and waits no more")
	require.Equal(t, []string{"a-0", "a-2"}, applied())
}
