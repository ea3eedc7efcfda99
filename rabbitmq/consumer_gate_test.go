package rabbitmq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// gate is a broker.ProbingGate the test sets.
type gate struct {
	mu               sync.Mutex
	engaged, probing bool
	changed          chan struct{}
}

var _ broker.ProbingGate = (*gate)(nil)

func newGate(engaged, probing bool) *gate {
	return &gate{engaged: engaged, probing: probing, changed: make(chan struct{})}
}

func (g *gate) Engaged() (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.engaged, g.changed
}

func (g *gate) Probing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.probing
}

func (g *gate) set(engaged, probing bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.engaged, g.probing = engaged, probing
	close(g.changed)
	g.changed = make(chan struct{})
}

// While the gate probes, a subscription takes one delivery: the broker keeps
// the other 49 ready (a failed probe gives back one delivery, not the 16 of
// the prefetch). Once the gate releases, it takes its full prefetch again —
// while the probe's handler still runs — and every message is handled once.
func TestConsumerTakesOneDeliveryWhileProbing(t *testing.T) {
	t.Parallel()
	const n, prefetch = 50, 16
	queue := declareQueue(t, "probing")
	publishIDs(t, queue, n)
	g := newGate(false, true)
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Prefetch: prefetch, DrainTimeout: 10 * time.Second})
	require.NoError(t, err)
	started := make(chan string, n)
	release := make(chan struct{})
	var mu sync.Mutex
	handled := map[string]int{}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddConsumerHandler("h", queue, c.WithGate(g), func(msg *message.Message) error {
		started <- msg.Metadata.Get(sluice.EventIDKey)
		<-release
		mu.Lock()
		handled[msg.Metadata.Get(sluice.EventIDKey)]++
		mu.Unlock()
		return nil
	})
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })

	conn := testenv.AMQP(t)
	probe := <-started
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == n-1 }, time.Minute, 10*time.Millisecond,
		"one delivery unacked, the rest ready")
	require.Empty(t, started, "one handler running while probing")

	g.set(false, false) // released, the probe's handler still holding its delivery
	for range prefetch {
		require.NotEqual(t, probe, <-started)
	}
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == n-1-prefetch }, time.Minute, 10*time.Millisecond,
		"the full prefetch taken beside the probe")
	close(release)
	require.NoError(t, testenv.AwaitCount(n, 2*time.Minute, 10*time.Minute, func() int { mu.Lock(); defer mu.Unlock(); return len(handled) }),
		"every message handled once released")
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == 0 }, time.Minute, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for id, k := range handled {
		require.Equal(t, 1, k, id)
	}
}
