package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A broker whose connection lives — its heartbeats keep coming — and whose
// channels never answer (ChannelsSilent: a channel process stuck, a queue
// whose leader is cut off) holds no wait of Sluice's on it past its bound:
// the Consumer's channel opening, prefetch and consume on a new
// connection, and its cancel of a probe's consumer once the brake
// releases (WriteTimeout each; the Consumer then consumes on a new
// connection, and Close returns at once); the Publisher's channel opening
// (WriteTimeout, under its lock: Publish and Close waited with it);
// Topology.Declare (its ctx, or 30 s). Before, each waited as long as the
// heartbeats came: for ever.
func TestNoWaitOutlastsABrokerWhoseChannelsNeverAnswer(t *testing.T) {
	t.Parallel()
	config := func(url string) rabbitmq.ConsumerConfig {
		return rabbitmq.WithReconnectBackoff(rabbitmq.ConsumerConfig{
			Connection: rabbitmq.Connection{URL: url, WriteTimeout: time.Second}, Prefetch: 4, DrainTimeout: 5 * time.Second,
		}, 50*time.Millisecond)
	}
	// next is the next delivery of msgs, within a bound far above
	// WriteTimeout and the reconnection's backoff.
	next := func(t *testing.T, msgs <-chan *message.Message, why string) *message.Message {
		t.Helper()
		select {
		case m := <-msgs:
			return m
		case <-time.After(2 * time.Minute):
			t.Fatal(why)
			return nil
		}
	}
	closeWithin := func(t *testing.T, c interface{ Close() error }) {
		t.Helper()
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("Close did not return: it waits on a call the broker never answers")
		}
	}

	// silentSubscription subscribes to a queue of its own through a proxy
	// whose channels never answer, and returns once the subscription's
	// channel.open-ok is swallowed: it waits on its channel's opening.
	silentSubscription := func(t *testing.T, prefix string) (*testenv.Proxy, *rabbitmq.Consumer, string, <-chan *message.Message) {
		q := declareQueue(t, prefix)
		proxy, url := testenv.ProxyAMQP(t)
		proxy.ChannelsSilent()
		c, err := rabbitmq.NewConsumer(config(url))
		require.NoError(t, err)
		msgs, err := c.Subscribe(context.Background(), q)
		require.NoError(t, err)
		checked := proxy.Silenced() // Subscribe's check of the queue, on a connection of its own, given up after WriteTimeout
		require.Eventually(t, func() bool { return proxy.Silenced() > checked }, time.Minute, time.Millisecond, "the subscription's channel.open-ok swallowed")
		return proxy, c, q, msgs
	}

	t.Run("a new connection's channel", func(t *testing.T) {
		t.Parallel()
		proxy, c, q, msgs := silentSubscription(t, "silent_open")
		proxy.ChannelsAnswerOnNewConnections()
		publishIDs(t, q, 1)
		m := next(t, msgs, "nothing consumed: the Consumer still waits for its channel's opening on the silent connection")
		require.Equal(t, "evt-0", m.Metadata.Get(sluice.EventIDKey))
		m.Ack()
		closeWithin(t, c)
	})

	t.Run("Close while a channel's opening waits", func(t *testing.T) {
		t.Parallel()
		_, c, _, _ := silentSubscription(t, "silent_close")
		closeWithin(t, c)
	})

	t.Run("the cancel of a probe's consumer", func(t *testing.T) {
		t.Parallel()
		q := declareQueue(t, "silent_cancel")
		proxy, url := testenv.ProxyAMQP(t)
		c, err := rabbitmq.NewConsumer(config(url))
		require.NoError(t, err)
		g := newGate(false, true)
		msgs, err := c.WithGate(g).Subscribe(t.Context(), q)
		require.NoError(t, err)
		publishIDs(t, q, 2)
		probe := next(t, msgs, "the probe's delivery")
		proxy.ChannelsSilent()
		g.set(false, false) // released: the loop cancels the probe's consumer, whose cancel-ok is swallowed
		require.Eventually(t, func() bool { return proxy.Silenced() > 0 }, time.Minute, time.Millisecond, "the cancel-ok swallowed")
		proxy.ChannelsAnswerOnNewConnections()
		probe.Ack() // sent on the silent connection, or lost with it: the broker redelivers the probe's message then
		seen := map[string]bool{}
		for !seen["evt-1"] {
			m := next(t, msgs, "evt-1 not consumed: the Consumer still waits for the probe consumer's cancel on the silent connection")
			seen[m.Metadata.Get(sluice.EventIDKey)] = true
			m.Ack()
		}
		closeWithin(t, c)
	})

	t.Run("a publisher's channel", func(t *testing.T) {
		t.Parallel()
		q := declareQueue(t, "silent_publish")
		proxy, url := testenv.ProxyAMQP(t)
		proxy.ChannelsSilent()
		p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url, WriteTimeout: time.Second}})
		require.NoError(t, err)
		published := make(chan error, 1)
		go func() { published <- p.Publish(q, message.NewMessage("m-1", []byte("x"))) }()
		select {
		case err := <-published:
			require.ErrorContains(t, err, "opening a channel: the broker gave no answer within 1s")
		case <-time.After(time.Minute):
			t.Fatal("Publish did not return: it waits for its channel's opening, under the publisher's lock")
		}
		proxy.ChannelsAnswerOnNewConnections()
		// A new connection, whose channels answer (within WriteTimeout: on a
		// loaded machine, perhaps not the first time; nothing is sent then).
		require.Eventually(t, func() bool { return p.Publish(q, message.NewMessage("m-2", []byte("x"))) == nil }, time.Minute, 10*time.Millisecond)
		closeWithin(t, p)
		require.Equal(t, 1, testenv.QueueDepth(t, testenv.AMQP(t), q))
	})

	t.Run("a topology's declaration", func(t *testing.T) {
		t.Parallel()
		proxy, url := testenv.ProxyAMQP(t)
		conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: url}, "silent declare")
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: testenv.Name("silent_declare")})
		require.NoError(t, err)
		proxy.ChannelsSilent()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		declared := make(chan error, 1)
		go func() { _, err := topo.Declare(ctx, conn); declared <- err }()
		select {
		case err := <-declared:
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorContains(t, err, "declaring the topology of silent_declare_")
		case <-time.After(time.Minute):
			t.Fatal("Declare did not return when its context ended")
		}
		require.True(t, conn.IsClosed(), "the connection it waited on is closed")
	})

	t.Run("a publisher's Close while its channel's opening waits", func(t *testing.T) {
		t.Parallel()
		q := declareQueue(t, "silent_publisher_close")
		proxy, url := testenv.ProxyAMQP(t)
		proxy.ChannelsSilent()
		// WriteTimeout far above the wait for Close below: Close gives
		// the opening up, it does not wait it out.
		p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url, WriteTimeout: 10 * time.Minute}})
		require.NoError(t, err)
		published := make(chan error, 1)
		go func() { published <- p.Publish(q, message.NewMessage("m-1", []byte("x"))) }()
		require.Eventually(t, func() bool { return proxy.Silenced() > 0 }, time.Minute, time.Millisecond, "the channel.open-ok swallowed")
		closeWithin(t, p)
		require.Error(t, <-published)
	})
}
