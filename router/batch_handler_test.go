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
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluiceredis"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
	"github.com/sluicemq/sluice/unitofwork"
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
	queue := projectionQueue(t, "projection")
	q := projectionBroker(t, queue, 128)

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
		tx := sluicesql.TxFromContext(ctx)
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
			Poison:   &poison.Config{},
			Retry:    &retrytiers.Config{},
			Classify: &stage.ClassifyConfig{},
			Inbox:    &deduplication.Config{Store: store},
			Env:      sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)

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
	// 2,400 deliveries: waited for while they move, not for a fixed time a
	// loaded machine measures. The rows first, then the queue and its tier
	// empty (the copies left are duplicates and retries).
	conn := testenv.AMQP(t)
	queues := []string{queue, queue + ".retry.100ms", queue + ".poison"}
	if err := testenv.AwaitCount(events-poisoned, time.Minute, 10*time.Minute, func() int { return count("") }); err != nil {
		t.Fatalf("every good event's row: %v; %s", err, testenv.QueueDepths(t, conn, queues...))
	}
	if err := testenv.AwaitDrained(time.Minute, 10*time.Minute, func() int {
		return testenv.QueueDepth(t, conn, queue) + testenv.QueueDepth(t, conn, queue+".retry.100ms")
	}); err != nil {
		t.Fatalf("the queue and its tier empty: %v; %s", err, testenv.QueueDepths(t, conn, queues...))
	}
	// Every copy of a poisoned event is poisoned (none is ever claimed).
	if err := testenv.AwaitCount(poisoned*copies, time.Minute, 10*time.Minute, func() int { return testenv.QueueDepth(t, conn, queue+".poison") }); err != nil {
		t.Fatalf("every copy of a poisoned event in the poison queue: %v; %s", err, testenv.QueueDepths(t, conn, queues...))
	}
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, q.Close())

	require.Equal(t, events-poisoned, count("DISTINCT"))
	require.Equal(t, events-poisoned, count(""), "each event's effect exists once")
	require.Positive(t, failedOnce.Load())
	_, largest := testenv.Histogram(t, reader, telemetry.MetricInboxBatchSize)
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

// Shutdown mid-batch on RabbitMQ 3.10 and PostgreSQL: the router closes
// while a batch handler is held in its call. Released within the shutdown
// grace, the held batch commits and is acked, and so do the deliveries
// that gathered meanwhile; past the grace, it rolls back whole, and its
// deliveries and those gathering go back unprocessed (no attempt spent:
// nothing in the retry tier). Either way nothing committed is left in the
// queue, and a second router takes up what is: each event's row exists
// once, nothing is left in the queue or its tier.
func TestABatchHandlerAtRouterShutdown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		releaseInTime bool
	}{{"released within the grace", true}, {"held past the grace", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			batchHandlerShutdown(t, tc.releaseInTime)
		})
	}
}

func batchHandlerShutdown(t *testing.T, releaseInTime bool) {
	db, schema, store := inbox(t)
	queue := projectionQueue(t, "shutdown-batch")
	conn := testenv.AMQP(t)
	newBroker := func() *rabbitmq.Broker { return projectionBroker(t, queue, 16) }
	write := func(ctx context.Context, msgs []*message.Message) []error {
		keys := make([]string, len(msgs))
		for i, m := range msgs {
			keys[i] = m.Metadata.Get(sluice.EventIDKey)
		}
		_, err := sluicesql.TxFromContext(ctx).ExecContext(ctx,
			fmt.Sprintf(`INSERT INTO %s.reservations (event_key) SELECT unnest(string_to_array($1, ','))`, schema), strings.Join(keys, ","))
		return deduplication.SameOutcome(msgs, err)
	}
	// run starts a router whose batch handler is handle.
	run := func(q *rabbitmq.Broker, grace time.Duration, handle func(context.Context, []*message.Message) []error) (*message.Router, <-chan error) {
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, watermill.NopLogger{})
		require.NoError(t, err)
		_, err = router.Add(r, router.HandlerConfig{
			Broker:       q,
			Name:         "shutdown",
			BatchHandler: &deduplication.BatchHandler{Handle: handle, MaxBatch: 4, MaxWait: 50 * time.Millisecond, Concurrency: 1},
			Stages: router.Stages{
				ShutdownGrace: grace,
				Poison:        &poison.Config{},
				Retry:         &retrytiers.Config{},
				Classify:      &stage.ClassifyConfig{},
				Inbox:         &deduplication.Config{Store: store},
			},
		})
		require.NoError(t, err)
		done := testenv.RunRouter(context.Background(), r)
		return r, done
	}
	count := func(distinct string) int {
		var n int
		require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(%s event_key) FROM %s.reservations`, distinct, schema)))
		return n
	}

	const events = 12
	q := newBroker()
	held, release := make(chan []string, 1), make(chan struct{})
	var calls atomic.Int64
	grace := time.Minute
	if !releaseInTime {
		grace = 300 * time.Millisecond
	}
	r, done := run(q, grace, func(ctx context.Context, msgs []*message.Message) []error {
		if calls.Add(1) == 1 {
			keys := make([]string, len(msgs))
			for i, m := range msgs {
				keys[i] = m.Metadata.Get(sluice.EventIDKey)
			}
			held <- keys
			if releaseInTime {
				<-release
			} else {
				<-ctx.Done() // the grace ran out: the batch's context ended
				return deduplication.SameOutcome(msgs, sluice.Transient(context.Cause(ctx)))
			}
		}
		return write(ctx, msgs)
	})
	for i := range events {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	var first []string
	select {
	case first = <-held:
	case <-time.After(time.Minute):
		t.Fatal("no batch ran")
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	// The subscriber has cancelled its consumer: the router is closing,
	// the batch still held.
	require.Eventually(t, func() bool { return testenv.QueueConsumers(t, conn, queue) == 0 }, time.Minute, 10*time.Millisecond)
	if releaseInTime {
		close(release)
	}
	require.NoError(t, <-closed)
	require.NoError(t, <-done)
	require.NoError(t, q.Close())

	committed := count("")
	require.Equal(t, committed, count("DISTINCT"))
	var keys []string
	require.NoError(t, db.Select(&keys, fmt.Sprintf(`SELECT event_key FROM %s.reservations`, schema)))
	if releaseInTime {
		// The held batch commits, and so do the deliveries handed to the
		// handler meanwhile (in flight: they gathered for the next batch).
		require.Subset(t, keys, first, "the held batch committed at close")
	} else {
		// The held batch rolls back whole. The deliveries gathered behind it
		// run once it returns: a batch whose context has ended rolls back
		// too, one that still had time commits (on a loaded machine 8 of
		// them did, in a fresh-clone make test), and either way nothing is
		// done twice or lost (below).
		for _, k := range first {
			require.NotContains(t, keys, k, "the held batch rolled back whole")
		}
	}
	// The rest went back to the queue unprocessed: the broker requeues a
	// closed channel's unacked deliveries on its own time, after Close has
	// returned here, so the depth is waited for, not read once.
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == events-committed }, time.Minute, 20*time.Millisecond,
		"the rest went back to the queue unprocessed: %d of %d", events-committed, events)
	require.Zero(t, testenv.QueueDepth(t, conn, queue+".retry.100ms"), "no attempt spent")
	require.Zero(t, testenv.QueueDepth(t, conn, queue+".poison"))

	// A second router takes up what is left.
	q = newBroker()
	r, done = run(q, 0, write)
	require.Eventually(t, func() bool {
		return count("") >= events && testenv.QueueDepth(t, conn, queue) == 0
	}, time.Minute, 20*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, q.Close())
	require.Equal(t, events, count("DISTINCT"))
	require.Equal(t, events, count(""), "each event's row exists once")
	require.Zero(t, testenv.QueueDepth(t, conn, queue+".retry.100ms"))
	require.Zero(t, testenv.QueueDepth(t, conn, queue+".poison"))
}

// A batch handler behind Watermill's own Timeout and Retry, on a broker
// with a small prefetch (router.Add sets BatchHandler.InFlight to it, so a
// batch closes once the 8 deliveries in flight are in it): 50 events, each
// published twice, every event's effect once, nothing left in the queue —
// on PostgreSQL (one claim statement, the effects in its transaction), the
// MemoryStore and Redis (their units of work claim many keys; on Redis a
// batch with a copy whose key is held fails ErrClaimInProgress, its events
// run alone, and that copy comes back from the tier), and Redis behind a
// store of one's own whose units of work take one claim (each event alone).
// Before, a batch of two or more failed on the MemoryStore and Redis ("Claim
// called twice"), batch after batch, into the poison queue.
func TestABatchHandlerBehindWatermillsTimeoutAndRetry(t *testing.T) {
	t.Parallel()
	const events = 50
	for _, tc := range []struct {
		name string
		// setup returns the store, the projection and how many effects it wrote.
		setup func(t *testing.T) (deduplication.Store, func(context.Context, []*message.Message) []error, func() int)
	}{
		{"postgres", func(t *testing.T) (deduplication.Store, func(context.Context, []*message.Message) []error, func() int) {
			db, schema, store := inbox(t)
			return store, func(ctx context.Context, msgs []*message.Message) []error {
				keys := make([]string, len(msgs))
				for i, m := range msgs {
					keys[i] = m.Metadata.Get(sluice.EventIDKey)
				}
				_, err := sluicesql.TxFromContext(ctx).ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.reservations (event_key) SELECT unnest(string_to_array($1, ','))`, schema), strings.Join(keys, ","))
				return deduplication.SameOutcome(msgs, err)
			}, func() int { return reservations(t, db, schema) }
		}},
		{"memory", func(*testing.T) (deduplication.Store, func(context.Context, []*message.Message) []error, func() int) {
			project, count := countedProjection()
			return deduplication.NewMemoryStore(), project, count
		}},
		{"redis", func(t *testing.T) (deduplication.Store, func(context.Context, []*message.Message) []error, func() int) {
			project, count := countedProjection()
			return redisInbox(t), project, count
		}},
		{"redis_one_claim", func(t *testing.T) (deduplication.Store, func(context.Context, []*message.Message) []error, func() int) {
			project, count := countedProjection()
			return oneClaimStore{redisInbox(t)}, project, count
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store, project, count := tc.setup(t)
			queue := projectionQueue(t, "projection_wm")
			q := projectionBroker(t, queue, 8)
			r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
			require.NoError(t, err)
			r.AddMiddleware(middleware.Timeout(time.Minute), middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}.Middleware)
			_, err = router.Add(r, router.HandlerConfig{
				Broker: q, Name: "projection",
				BatchHandler: &deduplication.BatchHandler{Handle: project, MaxWait: time.Second},
				Stages:       router.Stages{Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{}, Inbox: &deduplication.Config{Store: store}},
			})
			require.NoError(t, err)
			done := testenv.RunRouter(context.Background(), r)
			for i := range events * 2 {
				m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i%events))
				require.NoError(t, q.Publisher().Publish(queue, m))
			}
			conn := testenv.AMQP(t)
			require.NoError(t, testenv.AwaitCount(events, time.Minute, 10*time.Minute, count))
			require.NoError(t, testenv.AwaitDrained(time.Minute, 10*time.Minute, func() int {
				return testenv.QueueDepth(t, conn, queue) + testenv.QueueDepth(t, conn, queue+".retry.100ms")
			}))
			require.NoError(t, r.Close())
			require.NoError(t, <-done)
			require.NoError(t, q.Close())
			require.Equal(t, events, count(), "each event's effect once")
			require.Zero(t, testenv.QueueDepth(t, conn, queue+".poison"), "nothing poisoned")
		})
	}
}

// A batch handler on the Redis inbox, and on Redis behind a store of one's
// own whose units of work take one claim (each event of a batch runs
// alone), with Concurrency 1 on a broker whose prefetch hands it 8
// deliveries at once: every event done once, and never two units of work at
// a time — a pool sized to Concurrency suffices. Before, the events a batch
// ran alone ran all at once, beside its first.
func TestABatchHandlerOnRedisKeepsToItsConcurrency(t *testing.T) {
	t.Parallel()
	for _, oneClaim := range []bool{false, true} {
		t.Run(fmt.Sprintf("one_claim=%v", oneClaim), func(t *testing.T) {
			t.Parallel()
			var store deduplication.Store = redisInbox(t)
			if oneClaim {
				store = oneClaimStore{store}
			}
			batchHandlerKeepsToItsConcurrency(t, store)
		})
	}
}

// redisInbox is a Redis inbox on keys of the test's own.
func redisInbox(t *testing.T) *sluiceredis.Inbox {
	t.Helper()
	client, prefix := testenv.Redis(t)
	store, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{Prefix: prefix})
	require.NoError(t, err)
	return store
}

// oneClaimStore is a store of one's own whose units of work take one claim
// (unitofwork.Tx, not a deduplication.BatchClaimer): each event of a batch
// runs in a unit of work of its own.
type oneClaimStore struct{ deduplication.Store }

type oneClaimTx struct{ unitofwork.Tx }

func (s oneClaimStore) Begin(ctx context.Context) (unitofwork.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return oneClaimTx{tx}, nil
}

func batchHandlerKeepsToItsConcurrency(t *testing.T, store deduplication.Store) {
	const events = 40
	client, prefix := testenv.Redis(t)
	var running, peak, done atomic.Int64
	queue := projectionQueue(t, "projection_redis_c1")
	q := projectionBroker(t, queue, 8)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "projection",
		BatchHandler: &deduplication.BatchHandler{Concurrency: 1, MaxWait: time.Second, Handle: func(ctx context.Context, msgs []*message.Message) []error {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			defer running.Add(-1)
			ids := make([]any, len(msgs))
			for i, m := range msgs {
				ids[i] = m.Metadata.Get(sluice.EventIDKey)
			}
			// The projection's effect: a round trip to Redis, as a real one's.
			if err := client.SAdd(ctx, prefix+"projection", ids...).Err(); err != nil {
				return deduplication.SameOutcome(msgs, err)
			}
			done.Add(int64(len(msgs)))
			return nil
		}},
		Stages: router.Stages{Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{}, Inbox: &deduplication.Config{Store: store}},
	})
	require.NoError(t, err)
	for i := range events {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	runDone := testenv.RunRouter(context.Background(), r)
	require.NoError(t, testenv.AwaitCount(events, time.Minute, 10*time.Minute, func() int { return int(done.Load()) }))
	require.NoError(t, r.Close())
	require.NoError(t, <-runDone)
	require.NoError(t, q.Close())
	require.EqualValues(t, events, done.Load(), "each event once")
	require.EqualValues(t, events, client.SCard(context.Background(), prefix+"projection").Val(), "every event's effect")
	require.EqualValues(t, 1, peak.Load(), "one unit of work at a time")
}

// countedProjection is a batch handler's projection outside any
// transaction (a store that joins none): it counts the events it was
// handed, each once.
func countedProjection() (func(context.Context, []*message.Message) []error, func() int) {
	var n atomic.Int64
	return func(_ context.Context, msgs []*message.Message) []error {
		n.Add(int64(len(msgs)))
		return nil
	}, func() int { return int(n.Load()) }
}

// projectionQueue is a fresh queue name, its queue, poison queue and
// 100 ms tier deleted once the test ends.
func projectionQueue(t *testing.T, name string) string {
	t.Helper()
	queue := testenv.Name(name)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.100ms")
	return queue
}

// projectionBroker is a broker on queue, with one 100 ms retry tier and
// the given prefetch.
func projectionBroker(t *testing.T, queue string, prefetch int) *rabbitmq.Broker {
	t.Helper()
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{100 * time.Millisecond}},
		Prefetch:   prefetch,
	})
	require.NoError(t, err)
	return q
}
