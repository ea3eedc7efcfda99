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
// channels stop answering (a channel process stuck, a queue whose leader
// is cut off; the proxy forwards the connection's frames only, from a
// given point on) holds no wait of Sluice's on it past its bound: the
// Consumer's channel opening and prefetch (WriteTimeout, and Close ends
// them at once), its consume and its cancel of a probe's consumer once the
// brake releases (70 s: a quorum queue's Raft command; shorter here), after
// which it consumes on a new connection; the Publisher's channel opening
// and confirm mode (WriteTimeout, under its lock: Publish and Close waited
// with it); Topology.Declare (its ctx, or 70 s). Before, each waited as
// long as the heartbeats came: for ever.
func TestNoWaitOutlastsABrokerWhoseChannelsNeverAnswer(t *testing.T) {
	t.Parallel()
	config := func(url string, writeTimeout time.Duration) rabbitmq.ConsumerConfig {
		cfg := rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: url, WriteTimeout: writeTimeout}, Prefetch: 4, DrainTimeout: 5 * time.Second}
		return rabbitmq.WithQueueCallTimeout(rabbitmq.WithReconnectBackoff(cfg, 50*time.Millisecond), time.Second)
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
	// whose second connection (the subscription's: Subscribe checks the
	// queue on the first) answers its channels' first after frames and
	// none after, and returns once one is swallowed.
	silentSubscription := func(t *testing.T, prefix string, after int, writeTimeout time.Duration) (*testenv.Proxy, *rabbitmq.Consumer, string, <-chan *message.Message) {
		q := declareQueue(t, prefix)
		proxy, url := testenv.ProxyAMQP(t)
		proxy.SilenceChannelsFrom(2, after)
		c, err := rabbitmq.NewConsumer(config(url, writeTimeout))
		require.NoError(t, err)
		msgs, err := c.Subscribe(context.Background(), q)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return proxy.Silenced() > 0 }, time.Minute, time.Millisecond, "an answer of the subscription's channel swallowed")
		return proxy, c, q, msgs
	}

	for _, tc := range []struct {
		name  string
		after int // the subscription's channel frames answered: channel.open-ok, basic.qos-ok, basic.consume-ok
	}{{"a new connection's channel opening", 0}, {"a new connection's prefetch", 1}, {"a new connection's consume", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy, c, q, msgs := silentSubscription(t, "silent_open", tc.after, time.Second)
			proxy.ChannelsAnswerOnNewConnections()
			publishIDs(t, q, 1)
			m := next(t, msgs, "nothing consumed: the Consumer still waits on the silent connection")
			require.Equal(t, "evt-0", m.Metadata.Get(sluice.EventIDKey))
			m.Ack()
			closeWithin(t, c)
		})
	}

	t.Run("Close while a channel's opening waits", func(t *testing.T) {
		t.Parallel()
		// WriteTimeout far above Close's bound: Close gives the opening
		// up, it does not wait it out.
		_, c, _, _ := silentSubscription(t, "silent_close", 0, 10*time.Minute)
		closeWithin(t, c)
	})

	t.Run("the cancel of a probe's consumer", func(t *testing.T) {
		t.Parallel()
		q := declareQueue(t, "silent_cancel")
		proxy, url := testenv.ProxyAMQP(t)
		c, err := rabbitmq.NewConsumer(config(url, time.Second))
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

	for _, tc := range []struct {
		name, what string
		after      int // the publisher's channel frames answered: channel.open-ok, confirm.select-ok
	}{{"a publisher's channel opening", "opening a channel", 0}, {"a publisher's confirm mode", "enabling publisher confirms", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q := declareQueue(t, "silent_publish")
			proxy, url := testenv.ProxyAMQP(t)
			proxy.SilenceChannelsFrom(1, tc.after)
			p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url, WriteTimeout: time.Second}})
			require.NoError(t, err)
			published := make(chan error, 1)
			go func() { published <- p.Publish(q, message.NewMessage("m-1", []byte("x"))) }()
			select {
			case err := <-published:
				require.ErrorContains(t, err, tc.what+": the broker gave no answer within 1s")
			case <-time.After(time.Minute):
				t.Fatal("Publish did not return: it waits for its channel, under the publisher's lock")
			}
			proxy.ChannelsAnswerOnNewConnections()
			// A new connection, whose channels answer (within WriteTimeout:
			// on a loaded machine, perhaps not the first time; nothing is
			// sent then).
			require.Eventually(t, func() bool { return p.Publish(q, message.NewMessage("m-2", []byte("x"))) == nil }, time.Minute, 10*time.Millisecond)
			closeWithin(t, p)
			require.Equal(t, 1, testenv.QueueDepth(t, testenv.AMQP(t), q))
		})
	}

	for _, tc := range []struct {
		name, what string
		after      int // the declaration's channel frames answered: channel.open-ok, queue.declare-ok…
	}{{"a topology's channel opening", "opening a channel", 0}, {"a topology's queue declaration", "declaring queue silent_declare_", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy, url := testenv.ProxyAMQP(t)
			conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: url}, "silent declare")
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: testenv.Name("silent_declare"), TierDelays: []time.Duration{time.Second}})
			require.NoError(t, err)
			for _, d := range topo.Plan().Queues {
				testenv.DeleteQueuesAtEnd(t, d.Name) // those declared before the silence
			}
			proxy.SilenceChannelsFrom(1, tc.after)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			declared := make(chan error, 1)
			go func() { _, err := topo.Declare(ctx, conn); declared <- err }()
			select {
			case err := <-declared:
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.ErrorContains(t, err, tc.what)
			case <-time.After(time.Minute):
				t.Fatal("Declare did not return when its context ended")
			}
			require.True(t, conn.IsClosed(), "the connection it waited on is closed")
		})
	}

	// publishOnSilent publishes m, in the background, with a Publisher
	// whose broker's channels never answer and whose WriteTimeout is far
	// above the test's waits: only Close, or m's context, ends the
	// publish's wait for its channel's opening.
	publishOnSilent := func(t *testing.T, prefix string, m *message.Message) (*rabbitmq.Publisher, <-chan error) {
		q := declareQueue(t, prefix)
		proxy, url := testenv.ProxyAMQP(t)
		proxy.ChannelsSilent()
		p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url, WriteTimeout: 10 * time.Minute}})
		require.NoError(t, err)
		published := make(chan error, 1)
		go func() { published <- p.Publish(q, m) }()
		require.Eventually(t, func() bool { return proxy.Silenced() > 0 }, time.Minute, time.Millisecond, "the channel.open-ok swallowed")
		return p, published
	}

	t.Run("a publisher's Close while its channel's opening waits", func(t *testing.T) {
		t.Parallel()
		p, published := publishOnSilent(t, "silent_publisher_close", message.NewMessage("m-1", []byte("x")))
		closeWithin(t, p)
		require.Error(t, <-published)
	})

	t.Run("a publish's context while its channel's opening waits", func(t *testing.T) {
		t.Parallel()
		// A first publish, with no deadline, starts the opening (once its
		// dial is through); the second, whose context ends in a second,
		// finds it in progress.
		p, _ := publishOnSilent(t, "silent_publish_ctx", message.NewMessage("m-0", []byte("x")))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		m := message.NewMessage("m-1", []byte("x"))
		m.SetContext(ctx)
		published := make(chan error, 1)
		go func() { published <- p.Publish(testenv.Name("silent_publish_ctx_unrouted"), m) }()
		select {
		case err := <-published:
			require.True(t, sluice.Unreachable(err), "not sent, and known not sent: %v", err)
			require.ErrorContains(t, err, "a channel's opening in progress")
		case <-time.After(time.Minute):
			t.Fatal("Publish waited past its message's context for a channel's opening")
		}
		closeWithin(t, p)
	})
}
