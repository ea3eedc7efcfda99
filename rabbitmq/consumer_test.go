package rabbitmq_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// runConsumer runs handler on queue through a Consumer behind a Watermill
// router (one handler) and returns a function that closes both.
func runConsumer(t *testing.T, queue string, prefetch int, handler message.NoPublishHandlerFunc) (stop func()) {
	t.Helper()
	_, stop = runConsumerLogged(t, queue, prefetch, handler)
	return stop
}

// runConsumerLogged is runConsumer, also returning a channel closed when
// the router begins to close.
func runConsumerLogged(t *testing.T, queue string, prefetch int, handler message.NoPublishHandlerFunc) (closing <-chan struct{}, stop func()) {
	t.Helper()
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Prefetch: prefetch, DrainTimeout: 10 * time.Second})
	require.NoError(t, err)
	logger := testenv.NewClosingLogger()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger)
	require.NoError(t, err)
	r.AddConsumerHandler("h", queue, c, handler)
	done := testenv.RunRouter(context.Background(), r)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, r.Close())
			require.NoError(t, <-done)
			require.NoError(t, c.Close())
		})
	}
	t.Cleanup(stop)
	return logger.Closing, stop
}

func publishIDs(t *testing.T, queue string, n int) {
	t.Helper()
	pub := newPublisher(t, "")
	var ms []*message.Message
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		ms = append(ms, m)
	}
	require.NoError(t, pub.Publish(queue, ms...))
}

// One subscription, 16 deliveries in flight, handlers taking 0–20 ms: acks
// go out in any order, each by its own delivery tag. Every message is
// handled once and the queue ends empty — a tag acked twice would close the
// channel and redeliver.
func TestConsumerOutOfOrderAcks(t *testing.T) {
	t.Parallel()
	queue := declareQueue(t, "ooo")
	const n = 300
	var (
		mu               sync.Mutex
		seen             = map[string]int{}
		running, maxSeen atomic.Int64
	)
	stop := runConsumer(t, queue, 16, func(msg *message.Message) error {
		now := running.Add(1)
		defer running.Add(-1)
		for old := maxSeen.Load(); now > old && !maxSeen.CompareAndSwap(old, now); old = maxSeen.Load() {
		}
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		mu.Lock()
		seen[msg.Metadata.Get(sluice.EventIDKey)]++
		mu.Unlock()
		return nil
	})
	publishIDs(t, queue, n)
	conn := testenv.AMQP(t)
	if err := testenv.AwaitCount(n, 2*time.Minute, 10*time.Minute, func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }); err != nil {
		t.Fatalf("every message handled: %v; %s", err, testenv.QueueDepths(t, conn, queue))
	}
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == 0 }, time.Minute, 10*time.Millisecond)
	stop() // drains: a redelivery in flight has been handled by now, and none comes after
	mu.Lock()
	defer mu.Unlock()
	for id, k := range seen {
		require.Equal(t, 1, k, "%s handled %d times", id, k)
	}
	require.Greater(t, maxSeen.Load(), int64(4), "deliveries were handled concurrently")
}

// Closing the router while 16 handlers are in flight: they finish and are
// acked before the channel closes; what was prefetched but not started goes
// back unprocessed. A second consumer handles the rest: every message
// exactly once, none twice — no inbox would have anything to absorb.
func TestConsumerDrainingClose(t *testing.T) {
	t.Parallel()
	queue := declareQueue(t, "drain")
	const n = 200
	var (
		mu      sync.Mutex
		seen    = map[string]int{}
		started atomic.Int64
	)
	const before, prefetch = 40, 16
	release := make(chan struct{}) // holds the first consumer's handlers after the first 40
	handler := func(hold bool) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			if started.Add(1) > before && hold {
				<-release
			}
			mu.Lock()
			seen[msg.Metadata.Get(sluice.EventIDKey)]++
			mu.Unlock()
			return nil
		}
	}
	closing, stop := runConsumerLogged(t, queue, prefetch, handler(true))
	publishIDs(t, queue, n)
	require.NoError(t, testenv.AwaitCount(before+prefetch, time.Minute, 10*time.Minute, func() int { return int(started.Load()) }),
		"%d handled, then %d handlers held", before, prefetch)
	testenv.CloseMidHandler(t, closing, queue, release, stop) // the 16 in flight finish and are acked before the channel closes
	mu.Lock()
	handledFirst := len(seen)
	mu.Unlock()
	require.Equal(t, before+prefetch, handledFirst, "closed mid-load: what was in flight was handled, nothing after")

	stop = runConsumer(t, queue, prefetch, handler(false))
	if err := testenv.AwaitCount(n, 2*time.Minute, 10*time.Minute, func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }); err != nil {
		t.Fatalf("every message handled, the rest by the second consumer: %v; %s", err, testenv.QueueDepths(t, testenv.AMQP(t), queue))
	}
	stop() // drains: a redelivery in flight has been handled by now
	mu.Lock()
	defer mu.Unlock()
	for id, k := range seen {
		require.Equal(t, 1, k, "%s handled %d times: the close redelivered work in flight", id, k)
	}
}
