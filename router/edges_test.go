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
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
)

func newRabbitMQ(t *testing.T, queue string, delays ...time.Duration) *rabbitmq.Broker {
	t.Helper()
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		URL:      testenv.AMQPURL,
		Topology: rabbitmq.TopologyConfig{Queue: queue, TierDelays: delays},
	})
	require.NoError(t, err)
	names := []string{queue, q.Topology().PoisonQueue()}
	for _, tier := range q.Topology().Tiers() {
		names = append(names, tier.Topic)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// Two handlers on one queue would silently split its messages; one name
// twice would panic inside Watermill. Both are errors at Add.
func TestAddRefusesASecondHandlerOnAQueueAndADuplicateName(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("orders")
	first, second := newRabbitMQ(t, queue), newRabbitMQ(t, queue)
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	noop := func(*message.Message) error { return nil }

	_, err = router.Add(r, router.HandlerConfig{Broker: first, Name: "inventory", Handler: noop})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{Broker: second, Name: "billing", Handler: noop})
	require.ErrorIs(t, err, router.ErrDuplicateHandler)
	require.ErrorContains(t, err, `already consumed by handler "inventory"`)

	other := newRabbitMQ(t, testenv.Name("other"))
	_, err = router.Add(r, router.HandlerConfig{Broker: other, Name: "inventory", Handler: noop})
	require.ErrorIs(t, err, router.ErrDuplicateHandler)
	require.ErrorContains(t, err, `a handler named "inventory-0" is already on this router`)
	require.Len(t, r.Handlers(), rabbitmq.ConsumersDefault, "the refused Adds added nothing")
}

// Watermill's Retry added to the router after Sluice's stages runs inside
// the inbox transaction. A handler that wrote its row and failed once must
// still leave one row: the second run inside the same transaction is
// refused (deduplication.Reentry) and the delivery goes to its tier as if
// the Retry were not there.
func TestRetryInsideTheInboxRunsTheHandlerOncePerTransaction(t *testing.T) {
	t.Parallel()
	db, schema, store := inbox(t)
	queue := testenv.Name("orders")
	q := newRabbitMQ(t, queue, 100*time.Millisecond)

	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	var runs atomic.Int64
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "inventory", Consumers: 1,
		Handler: func(msg *message.Message) error {
			_, err := sqlstore.TxFromContext(msg.Context()).ExecContext(msg.Context(),
				fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), msg.Metadata.Get(sluice.EventIDKey))
			if err != nil {
				return err
			}
			if runs.Add(1) == 1 {
				return sluice.Transient(errors.New("stock service: timeout"))
			}
			return nil
		},
		Stages: router.Stages{
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &middleware.ClassifyConfig{},
			Inbox: &deduplication.Config{Store: store, Consumer: "inventory"},
		},
	})
	require.NoError(t, err)
	// Added after the stages: Watermill runs it inside them.
	r.AddMiddleware(wmiddleware.Retry{MaxRetries: 3, InitialInterval: 5 * time.Millisecond}.Middleware)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()

	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	require.NoError(t, q.Publisher().Publish(queue, m))
	count := func() int {
		var n int
		require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
		return n
	}
	require.Eventually(t, func() bool { return count() == 1 }, 15*time.Second, 20*time.Millisecond)
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool {
		return testenv.QueueDepth(t, conn, queue) == 0 && testenv.QueueDepth(t, conn, queue+".retry.100ms") == 0
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.Equal(t, 1, count(), "one business row for one event")
	require.Equal(t, int64(2), runs.Load(), "one run per transaction: the failed one, then the tier's copy")
	require.Zero(t, testenv.QueueDepth(t, conn, queue+".poison"))
}

// Reentry on its own: a second run in one unit of work is refused with the
// first run's error wrapped, so the class is the first run's.
func TestReentryKeepsTheFirstRunsClass(t *testing.T) {
	t.Parallel()
	d, err := deduplication.New(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c"})
	require.NoError(t, err)
	var runs int
	inner := deduplication.Reentry(func(*message.Message) ([]*message.Message, error) {
		runs++
		return nil, sluice.Poison(errors.New("unknown version"))
	})
	retry := wmiddleware.Retry{MaxRetries: 2}.Middleware
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	_, err = d(retry(inner))(m)
	require.Equal(t, 1, runs)
	require.ErrorIs(t, err, deduplication.ErrHandlerReentered)
	require.Equal(t, sluice.ClassPoison, sluice.ClassOf(err))
}
