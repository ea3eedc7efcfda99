package router_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
)

// A batch handler through the whole stack on RabbitMQ and PostgreSQL: 300
// events each published 8 times, a tenth failing once (Transient: a retry
// tier, then done), every 25th poisoned. Each done event's row exists once,
// the poisoned ones are in the poison queue with their reason, nothing is
// left in the queue or its tier, and batches held more than one event.
func TestABatchHandlerOnRabbitMQ(t *testing.T) {
	t.Parallel()
	db, schema, store := inbox(t)
	reader := sdkmetric.NewManualReader()
	queue := testenv.Name("projection")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{100 * time.Millisecond}},
		Prefetch:   128,
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.100ms")

	var failedOnce, calls atomic.Int64
	project := func(ctx context.Context, msgs []*message.Message) []error {
		calls.Add(1)
		out := make([]error, len(msgs))
		var keys []string
		for i, m := range msgs {
			n, _ := strconv.Atoi(strings.TrimPrefix(m.Metadata.Get(sluice.EventIDKey), "evt-"))
			switch {
			case n%25 == 0:
				out[i] = sluice.Poison(errors.New("unknown product"))
			case n%10 == 0 && m.Metadata.Get(sluice.AttemptKey) == "":
				failedOnce.Add(1)
				out[i] = fmt.Errorf("stock service: %w", context.DeadlineExceeded)
			default:
				keys = append(keys, m.Metadata.Get(sluice.EventIDKey))
			}
		}
		if len(keys) == 0 {
			return out
		}
		tx := sqlstore.TxFromContext(ctx)
		_, err := tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.reservations (event_key) SELECT unnest(string_to_array($1, ','))`, schema), strings.Join(keys, ","))
		if err != nil {
			for i := range out {
				if out[i] == nil {
					out[i] = err
				}
			}
		}
		return out
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker:       q,
		Name:         "projection",
		BatchHandler: &deduplication.BatchHandler{Handle: project, MaxWait: 20 * time.Millisecond},
		Stages: router.Stages{
			Poison:        &poison.Config{},
			Retry:         &retrytiers.Config{},
			Classify:      &middleware.ClassifyConfig{},
			Inbox:         &deduplication.Config{Store: store},
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()

	const events, copies = 300, 8
	poisoned := 0
	for i := range events {
		if i%25 == 0 {
			poisoned++
		}
		for range copies {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
			require.NoError(t, q.Publisher().Publish(queue, m))
		}
	}
	count := func(distinct string) int {
		var n int
		require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(%s event_key) FROM %s.reservations`, distinct, schema)))
		return n
	}
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool {
		return count("") == events-poisoned && testenv.QueueDepth(t, conn, queue) == 0 &&
			testenv.QueueDepth(t, conn, queue+".retry.100ms") == 0
	}, time.Minute, 20*time.Millisecond)
	// Every copy of a poisoned event is poisoned (none is ever claimed).
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue+".poison") == poisoned*copies }, time.Minute, 20*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, q.Close())

	require.Equal(t, events-poisoned, count("DISTINCT"))
	require.Equal(t, events-poisoned, count(""), "each event's effect exists once")
	require.Positive(t, failedOnce.Load())
	_, largest := testenv.Histogram(t, reader, deduplication.MetricBatchSize)
	require.Greater(t, largest, int64(1), "batches of more than one event")
	require.Less(t, calls.Load(), int64(events*copies), "fewer calls than deliveries")
}

// Add refuses a batch handler it cannot keep the promise with.
func TestAddRefusesABatchHandlerItCannotRun(t *testing.T) {
	t.Parallel()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	e, err := embedded.New(embedded.Config{Topic: "batched"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	bh := &deduplication.BatchHandler{Handle: func(context.Context, []*message.Message) []error { return nil }}
	in := &deduplication.Config{Store: deduplication.NewMemoryStore()}

	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "b", BatchHandler: bh})
	require.ErrorContains(t, err, "BatchHandler needs Stages.Inbox")
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "b", BatchHandler: bh, Handler: func(*message.Message) error { return nil },
		Stages: router.Stages{Inbox: in}})
	require.ErrorContains(t, err, "give one of the three")
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "b", BatchHandler: bh,
		Stages: router.Stages{Inbox: in, Order: &ordering.Config{Store: ordering.NewMemoryStore()}}})
	require.ErrorIs(t, err, router.ErrUnsupported)
	require.ErrorContains(t, err, "does not keep a key's events in order")
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "b", BatchHandler: &deduplication.BatchHandler{Handle: bh.Handle, MaxBatch: -1},
		Stages: router.Stages{Inbox: in}})
	require.ErrorContains(t, err, "BatchHandler.MaxBatch")
}
