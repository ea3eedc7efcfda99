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
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
	"github.com/sluicemq/sluice/unitofwork"
)

func newRabbitMQ(t *testing.T, queue string, delays ...time.Duration) *rabbitmq.Broker {
	t.Helper()
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: delays},
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queueNames(q.Topology())...)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// queueNames is every queue of topo: the main queue, each tier's (all of a
// jittered tier's) and the poison queue, for DeleteQueuesAtEnd.
func queueNames(topo *rabbitmq.Topology) []string {
	var names []string
	for _, q := range topo.Queues() {
		names = append(names, q.Name)
	}
	return names
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
	require.ErrorContains(t, err, `a handler named "inventory" is already on this router`)
	require.Len(t, r.Handlers(), 1, "the refused Adds added nothing")
}

// Watermill's Retry added to the router after Sluice's stages runs inside
// the inbox transaction. A handler that wrote its row and failed once must
// still leave one row: the second run inside the same transaction is
// refused (unitofwork.Reentry) and the delivery goes to its tier as if
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
			_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
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
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Inbox: &deduplication.Config{Store: store, Consumer: "inventory"},
		},
	})
	require.NoError(t, err)
	// Added after the stages: Watermill runs it inside them.
	r.AddMiddleware(wmiddleware.Retry{MaxRetries: 3, InitialInterval: 5 * time.Millisecond}.Middleware)
	done := testenv.RunRouter(context.Background(), r)

	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	require.NoError(t, q.Publisher().Publish(queue, m))
	count := func() int {
		var n int
		require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
		return n
	}
	require.Eventually(t, func() bool { return count() == 1 }, time.Minute, 20*time.Millisecond)
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool {
		return testenv.QueueDepth(t, conn, queue) == 0 && testenv.QueueDepth(t, conn, queue+".retry.100ms") == 0
	}, time.Minute, 20*time.Millisecond)
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
	inner := unitofwork.Reentry(func(*message.Message) ([]*message.Message, error) {
		runs++
		return nil, sluice.Poison(errors.New("unknown version"))
	})
	retry := wmiddleware.Retry{MaxRetries: 2}.Middleware
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	_, err = d(retry(inner))(m)
	require.Equal(t, 1, runs)
	require.ErrorContains(t, err, "the handler ran again inside one inbox unit of work", "Reentry refused the second run")
	require.Equal(t, sluice.ClassPoison, sluice.ClassOf(err))
}

// The composition users build: Watermill's Timeout on the router, the whole
// stack on RabbitMQ with the PostgreSQL inbox, a foreign producer's 10 MiB
// payload with its AMQP properties, a handler that writes its row and then
// runs out of time. Every attempt's transaction is rolled back with the
// deadline, the copies go through every tier, and exactly one poison copy
// holds the payload and the properties byte for byte. The same with group
// commit: the timed-out delivery rolls back to its savepoint.
func TestTimeoutBehindTheRouterWithTheInboxAndALargeForeignMessage(t *testing.T) {
	t.Parallel()
	t.Run("one transaction per delivery", func(t *testing.T) { t.Parallel(); timeoutBehindTheRouter(t, nil) })
	t.Run("group commit", func(t *testing.T) { t.Parallel(); timeoutBehindTheRouter(t, &deduplication.BatchConfig{}) })
}

func timeoutBehindTheRouter(t *testing.T, batch *deduplication.BatchConfig) {
	db, schema, store := inbox(t)
	queue := testenv.Name("orders")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}},
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.50ms", queue+".retry.100ms")
	t.Cleanup(func() { _ = q.Close() })

	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(wmiddleware.Timeout(300 * time.Millisecond)) // before the stages: outside them
	var runs atomic.Int64
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "inventory", Consumers: 1,
		Handler: func(msg *message.Message) error {
			runs.Add(1)
			if _, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
				fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), msg.Metadata.Get(sluice.EventIDKey)); err != nil {
				return err
			}
			<-msg.Context().Done() // the stock service never answers
			return msg.Context().Err()
		},
		Stages: router.Stages{
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Inbox: &deduplication.Config{Store: store, Consumer: "inventory", Batch: batch}, Recoverer: &stage.RecovererConfig{},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)

	body := make([]byte, 10<<20)
	for i := range body {
		body[i] = byte(i)
	}
	conn := testenv.AMQP(t)
	ch := testenv.Channel(t, conn)
	require.NoError(t, ch.PublishWithContext(t.Context(), "", queue, false, false, amqp.Publishing{
		ContentType: "application/octet-stream", ContentEncoding: "identity", CorrelationId: "corr-1", MessageId: "m-1",
		Headers: amqp.Table{sluice.EventIDKey: "evt-slow", "__TypeId__": "com.example.Reserve"}, Body: body,
	}))
	// A liveness bound, not a measurement: on a loaded machine each hop of
	// the 10 MiB message (a consume, a confirmed 10 MiB copy) took 10–15 s,
	// the test process itself mostly idle, waiting for the broker.
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue+".poison") == 1 }, 5*time.Minute, 20*time.Millisecond)
	require.NoError(t, r.Close()) // the Consumer drains: the poisoned original is acked, not requeued
	require.NoError(t, <-done)

	// At most one run per attempt (the first and one per tier); fewer when
	// an attempt's deadline passed before its handler ran (its claim or
	// begin outlived 300 ms on a loaded machine: 2 runs in make test).
	require.LessOrEqual(t, runs.Load(), int64(3), "at most one run per attempt: the first and one per tier")
	require.Positive(t, runs.Load())
	var rows, claims int
	require.NoError(t, db.Get(&rows, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
	require.NoError(t, db.Get(&claims, fmt.Sprintf(`SELECT count(*) FROM %s.inbox`, schema)))
	require.Zero(t, rows, "each attempt's writes rolled back with its deadline")
	require.Zero(t, claims)
	got := testenv.Drain(t, conn, queue+".poison")
	require.Len(t, got, 1)
	p := got[0]
	require.Equal(t, "exhausted", p.Headers[metakeys.PoisonClass])
	require.Equal(t, body, p.Body)
	require.Equal(t, "application/octet-stream", p.ContentType)
	require.Equal(t, "identity", p.ContentEncoding)
	require.Equal(t, "corr-1", p.CorrelationId)
	require.Equal(t, "m-1", p.MessageId)
	require.Equal(t, "com.example.Reserve", p.Headers["__TypeId__"])
	for _, tier := range []string{".retry.50ms", ".retry.100ms", ""} {
		require.Zero(t, testenv.QueueDepth(t, conn, queue+tier), "queue %q", queue+tier)
	}
}
