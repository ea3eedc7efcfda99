package router_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// inbox returns a PostgreSQL inbox and a reservations table in a schema of
// t's own.
func inbox(t *testing.T) (*sqlx.DB, string, *sluicesql.Inbox) {
	t.Helper()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s.reservations (event_key TEXT NOT NULL)`, schema))
	require.NoError(t, err)
	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)
	require.NoError(t, store.CreateTable(t.Context()))
	return db, schema, store
}

// TestRabbitMQStackWithPostgresInbox runs the whole stack on the real
// services: 4 competing consumers, the PostgreSQL inbox, 200 events each
// published twice, a tenth failing once. Every event's effect exists once.
// With group commit (Inbox.Batch) the same holds, the retry copies
// included, and deliveries share commits (lingering 50 ms to gather: a
// loaded machine delivers slowly).
func TestRabbitMQStackWithPostgresInbox(t *testing.T) {
	t.Parallel()
	t.Run("one transaction per delivery", func(t *testing.T) { t.Parallel(); stackWithPostgresInbox(t, nil, false) })
	t.Run("group commit", func(t *testing.T) {
		t.Parallel()
		stackWithPostgresInbox(t, &deduplication.BatchConfig{MaxWait: 50 * time.Millisecond, Linger: true}, false)
	})
	t.Run("group commit on a quorum queue with a delivery limit", func(t *testing.T) {
		t.Parallel()
		stackWithPostgresInbox(t, &deduplication.BatchConfig{MaxWait: 50 * time.Millisecond, Linger: true}, true)
	})
}

func stackWithPostgresInbox(t *testing.T, batch *deduplication.BatchConfig, quorum bool) {
	db, schema, store := inbox(t)
	reader := sdkmetric.NewManualReader()
	deliveryLimit := 0
	if quorum {
		deliveryLimit = 20 // RabbitMQ 4.x's default: nothing a batch does may spend it
	}

	queue := testenv.Name("orders")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology: rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{100 * time.Millisecond},
			Quorum: quorum, DeliveryLimit: deliveryLimit},
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.100ms")

	var failedOnce atomic.Int64
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	handlers, err := router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "inventory",
		Handler: func(msg *message.Message) error {
			id := msg.Metadata.Get(sluice.EventIDKey)
			if msg.Metadata.Get("flaky") == "1" && msg.Metadata.Get(sluice.AttemptKey) == "" {
				failedOnce.Add(1)
				return fmt.Errorf("stock service: %w", context.DeadlineExceeded)
			}
			_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
				fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), id)
			return err
		},
		Stages: router.Stages{
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: store, Consumer: "inventory", Batch: batch},
			Recoverer: &stage.RecovererConfig{},
			Env:       sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		},
	})
	require.NoError(t, err)
	require.Len(t, handlers, 1, "Sluice's Consumer: one subscription, Prefetch deliveries in flight")
	done := testenv.RunRouter(context.Background(), r)

	const events = 200
	for i := range events {
		for range 2 {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
			if i%10 == 0 {
				m.Metadata.Set("flaky", "1")
			}
			require.NoError(t, q.Publisher().Publish(queue, m))
		}
	}
	count := func() int { return reservations(t, db, schema) }
	// 400 deliveries and the retries: waited for while they move, not for
	// a fixed time a loaded machine measures (the three runs share it).
	conn := testenv.AMQP(t)
	if err := testenv.AwaitCount(events, 2*time.Minute, 10*time.Minute, count); err != nil {
		t.Fatalf("every event's row: %v; %s", err, testenv.QueueDepths(t, conn, queue, queue+".retry.100ms", queue+".poison"))
	}
	if err := testenv.AwaitDrained(time.Minute, 10*time.Minute, func() int {
		return testenv.QueueDepth(t, conn, queue) + testenv.QueueDepth(t, conn, queue+".retry.100ms")
	}); err != nil {
		t.Fatalf("the duplicates and retries consumed, the queue and its tier empty: %v; %s", err, testenv.QueueDepths(t, conn, queue, queue+".retry.100ms"))
	}
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, q.Close())

	var distinct int
	require.NoError(t, db.Get(&distinct, fmt.Sprintf(`SELECT count(DISTINCT event_key) FROM %s.reservations`, schema)))
	require.Equal(t, events, distinct)
	require.Equal(t, events, count(), "each event's effect exists once")
	require.Positive(t, failedOnce.Load())
	require.Zero(t, testenv.QueueDepth(t, conn, queue+".poison"))
	if batch != nil {
		require.Greater(t, testenv.HistogramMax(t, reader, telemetry.MetricInboxBatchSize), int64(1), "deliveries shared commits")
		// Each handler's group commits are told apart (before, the batch
		// size carried no attribute at all).
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(t.Context(), &rm))
		found := false
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != telemetry.MetricInboxBatchSize {
					continue
				}
				for _, p := range m.Data.(metricdata.Histogram[int64]).DataPoints {
					v, ok := p.Attributes.Value(semconv.MessagingConsumerGroupNameKey)
					require.True(t, ok, "the batch size names its handler: %v", p.Attributes)
					require.Equal(t, "inventory", v.AsString())
					found = true
				}
			}
		}
		require.True(t, found)
	}
}

// TestShutdownMidHandlerEffectOnce closes the router while a handler is in
// its transaction. ShutdownGrace lets it commit; Sluice's Consumer (the
// default) waits for the delivery's ack before it closes its channel (with
// watermill-amqp's subscriber the delivery would be nacked, redelivered, and
// found in the inbox by the restarted consumer). Either way the effect exists
// once and the handler ran once.
//
// With group commit the delivery's batch commits within the grace too.
func TestShutdownMidHandlerEffectOnce(t *testing.T) {
	t.Parallel()
	t.Run("one transaction per delivery", func(t *testing.T) { t.Parallel(); shutdownMidHandler(t, nil) })
	t.Run("group commit", func(t *testing.T) { t.Parallel(); shutdownMidHandler(t, &deduplication.BatchConfig{}) })
}

func shutdownMidHandler(t *testing.T, batch *deduplication.BatchConfig) {
	db, schema, store := inbox(t)
	queue := testenv.Name("shutdown")
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.30s", queue+".retry.5m", queue+".retry.30m")
	count := func() int { return reservations(t, db, schema) }

	var calls atomic.Int64
	inHandler := make(chan struct{}, 1)
	release := make(chan struct{})
	consume := func() (closing <-chan struct{}, stop func()) {
		q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: queue}})
		require.NoError(t, err)
		logger := testenv.NewClosingLogger()
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		require.NoError(t, err)
		_, err = router.Add(r, router.HandlerConfig{
			Broker: q,
			Name:   "inventory", Consumers: 1,
			Handler: func(msg *message.Message) error {
				calls.Add(1)
				inHandler <- struct{}{}
				<-release // the work in flight when Close is called
				_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
					fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ('evt-1')`, schema))
				return err
			},
			Stages: router.Stages{Classify: &stage.ClassifyConfig{}, Inbox: &deduplication.Config{Store: store, Consumer: "inventory", Batch: batch}},
		})
		require.NoError(t, err)
		done := testenv.RunRouter(context.Background(), r)
		return logger.Closing, func() {
			require.NoError(t, r.Close())
			require.NoError(t, <-done)
			require.NoError(t, q.Close())
		}
	}

	closing, stop := consume()
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	defer func() { _ = pub.Close() }()
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	require.NoError(t, pub.Publish(queue, m))
	<-inHandler
	stopped := make(chan struct{})
	go func() { defer close(stopped); stop() }()
	<-closing      // Close has begun, the handler still at work
	close(release) // it commits within the shutdown grace
	<-stopped
	require.Equal(t, 1, count(), "the handler in flight committed within the shutdown grace")

	_, stop = consume()
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == 0 }, time.Minute, 20*time.Millisecond)
	stop() // drains: a redelivery in flight has run by now
	require.Equal(t, 1, count(), "the effect exists once")
	require.Equal(t, int64(1), calls.Load(), "the redelivery was a duplicate: the handler did not run again")
}

// The draining close under load, on the whole stack: the router closes with
// 16 handlers in flight on Sluice's Consumer; a second router consumes the
// rest. The inbox never sees a duplicate (sluice.inbox.duplicates stays 0
// across the restart) and every event has its row once.
func TestDrainingCloseUnderLoadNoDuplicates(t *testing.T) {
	t.Parallel()
	const n = 200
	db, schema, store := inbox(t)
	queue := testenv.Name("drain")
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.30s", queue+".retry.5m", queue+".retry.30m")
	reader := sdkmetric.NewManualReader()
	var started atomic.Int64
	const before = 40              // handled before the close
	release := make(chan struct{}) // holds the first router's handlers after those
	consume := func(hold bool) (closing <-chan struct{}, stop func()) {
		q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: queue}})
		require.NoError(t, err)
		logger := testenv.NewClosingLogger()
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		require.NoError(t, err)
		_, err = router.Add(r, router.HandlerConfig{
			Broker: q, Name: "inventory",
			Handler: func(msg *message.Message) error {
				if started.Add(1) > before && hold {
					<-release // in flight when Close is called
				}
				_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
					fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), msg.Metadata.Get(sluice.EventIDKey))
				return err
			},
			Stages: router.Stages{
				Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
				Inbox: &deduplication.Config{Store: store, Consumer: "inventory"},
				Env:   sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
			},
		})
		require.NoError(t, err)
		done := testenv.RunRouter(context.Background(), r)
		return logger.Closing, func() {
			require.NoError(t, r.Close())
			require.NoError(t, <-done)
			require.NoError(t, q.Close())
		}
	}
	rows := func() (all, distinct int) {
		require.NoError(t, db.QueryRow(fmt.Sprintf(`SELECT count(*), count(DISTINCT event_key) FROM %s.reservations`, schema)).Scan(&all, &distinct))
		return all, distinct
	}

	closing, stop := consume(true)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	defer func() { _ = pub.Close() }()
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		require.NoError(t, pub.Publish(queue, m))
	}
	const prefetch = 16 // the Consumer's deliveries in flight
	require.NoError(t, testenv.AwaitCount(before+prefetch, time.Minute, 10*time.Minute, func() int { return int(started.Load()) }),
		"%d handled, then %d handlers held", before, prefetch)
	testenv.CloseMidHandler(t, closing, queue, release, stop) // the 16 in flight finish and are acked before the channel closes
	first, _ := rows()
	require.Equal(t, before+prefetch, first, "closed mid-load: what was in flight committed, nothing after")

	_, stop = consume(false)
	if err := testenv.AwaitCount(n, 2*time.Minute, 10*time.Minute, func() int { _, d := rows(); return d }); err != nil {
		t.Fatalf("every event's row, the rest by the second router: %v; %s", err, testenv.QueueDepths(t, testenv.AMQP(t), queue))
	}
	stop() // drains: a redelivery in flight has run by now
	all, distinct := rows()
	require.Equal(t, n, all)
	require.Equal(t, n, distinct)
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricInboxDuplicates), "no redelivery reached the inbox")
	require.Equal(t, int64(n), started.Load(), "each handler ran once")
	t.Logf("closed with %d of %d committed", first, n)
}

// reservations counts the rows of schema's reservations table.
func reservations(t *testing.T, db *sqlx.DB, schema string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
	return n
}
