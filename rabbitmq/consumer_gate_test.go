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
	"github.com/sluicemq/sluice/internal/settle"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// gate is a broker.ProbingGate the test sets.
type gate struct {
	mu               sync.Mutex
	engaged, probing bool
	changed          chan struct{}
	read             chan struct{} // when set, told of each read
}

var _ broker.ProbingGate = (*gate)(nil)

func newGate(engaged, probing bool) *gate {
	return &gate{engaged: engaged, probing: probing, changed: make(chan struct{})}
}

func (g *gate) Engaged() (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.read != nil {
		select {
		case g.read <- struct{}{}:
		default:
		}
	}
	return g.engaged, g.changed
}

// setUnheard sets the gate without telling: the consume loop has not heard
// of it yet when a delivery's settling reads it. The channel it returns is
// told of each read from then on.
func (g *gate) setUnheard(engaged, probing bool) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.engaged, g.probing = engaged, probing
	g.read = make(chan struct{}, 1)
	return g.read
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

// A nack sent while the gate is engaged waits for the consume loop to
// cancel the consumer (sent before, the broker would hand the delivery
// straight back to it); a gate that moves on to probing or released
// before the loop heard it engaged leaves the consumer consuming, and the
// nack goes at once. Before, it waited for a cancel that never came: the
// delivery stayed unacked, its key stalled, until the next engage or the
// shutdown. The same for a probe's ack when the gate, released, probes
// again before the loop heard the release. Found by a review.
func TestASettlingThatReadTheGateBeforeTheLoopDidIsNotHeldForever(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		probing          bool // the gate at the start
		unheard, settled [2]bool
		nack             bool
	}{
		{name: "nack, engaged then probing", unheard: [2]bool{true, false}, settled: [2]bool{false, true}, nack: true},
		{name: "nack, engaged then released", unheard: [2]bool{true, false}, settled: [2]bool{false, false}, nack: true},
		{name: "probe's ack, released then probing", probing: true, unheard: [2]bool{false, false}, settled: [2]bool{false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			queue := declareQueue(t, "unheard")
			publishIDs(t, queue, 1)
			g := newGate(false, tc.probing)
			c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Prefetch: 16, DrainTimeout: 10 * time.Second})
			require.NoError(t, err)
			sub := c.WithGate(g)
			t.Cleanup(func() { _ = sub.Close() })
			out, err := sub.Subscribe(t.Context(), queue)
			require.NoError(t, err)
			m := <-out

			read := g.setUnheard(tc.unheard[0], tc.unheard[1])
			if tc.nack {
				m.Nack()
			} else {
				m.Ack()
			}
			<-read                              // the settling read it (the loop reads it only when told)
			g.set(tc.settled[0], tc.settled[1]) // the loop hears this one
			select {
			case <-settle.Sent(m.Context()): // the Consumer wrote the ack or nack to the broker
			case <-time.After(time.Minute):
				t.Fatal("never sent: the delivery is held unacked")
			}
			if tc.nack {
				again := <-out
				require.Equal(t, m.Metadata.Get(sluice.EventIDKey), again.Metadata.Get(sluice.EventIDKey), "the nacked delivery, back")
				again.Ack()
			}
			require.NoError(t, sub.Close())
			require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), queue), "acked")
		})
	}
}
