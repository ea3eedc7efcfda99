package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// The upstream gap docs/rabbitmq.md writes up: watermill-amqp's subscriber
// (v3.0.2; BrokerConfig.WatermillSubscriber's, or your own through
// WithMarshaler), closed while it reconnects, leaves the connection its
// reconnection opens afterwards open. Its ConnectionWrapper dials again
// after the broker closed its connection, and Close neither stops that
// dial nor closes what it opens: the connection keeps its reader and
// heartbeater goroutines, and the broker a connection, for the life of the
// program. This test fails once upstream closes it; Sluice's own
// subscriber leaves none (TestABrokerClosedWhileReconnectingLeavesNoConnection).
func TestUpstreamWatermillSubscriberLeavesAConnectionWhenClosedWhileReconnecting(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	queue := testenv.Name("upstream_reconnect_close")
	testenv.DeleteQueuesNowAndAtEnd(t, queue)
	_, err := testenv.Channel(t, testenv.AMQP(t)).QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	cfg, err := rabbitmq.WithMarshaler(wamqp.NewDurableQueueConfig(url))
	require.NoError(t, err)
	log := testenv.NewLog()
	sub, err := wamqp.NewSubscriber(cfg, log)
	require.NoError(t, err)
	defer func() { _ = sub.Close() }()
	ctx, cancel := context.WithCancel(t.Context())
	msgs, err := sub.Subscribe(ctx, queue)
	require.NoError(t, err)
	// The subscription is ended first, as a router's shutdown does: a
	// subscription still waiting for the reconnection keeps Close waiting
	// until the reconnection connects (the second gap docs/rabbitmq.md
	// writes up), and its reads of the wrapper's connected channel race
	// with the reconnection's write of it (the third). The connection's
	// reconnection, under way at Close, is what leaves the connection.
	cancel()
	testenv.Within(t, 2*time.Minute, "the subscription's end with its context", func() {
		for range msgs { // closed when the subscription has ended
		}
	})
	// A write of this goroutine's to a socket before the reset: the race
	// detector orders socket I/O (syscall.Write releases what Read
	// acquires), and so sees the ended subscription's last read of the
	// connected channel before the reconnection's write of it, which comes
	// after its connection's reader read the reset.
	_ = testenv.QueueDepth(t, testenv.AMQP(t), queue)

	// The broker's connection.start to the next dial is held: the
	// subscriber's reconnection waits in its handshake.
	release := proxy.HoldFirstReplies()
	defer release()
	proxy.Reset()
	require.Eventually(t, func() bool { return proxy.Held() >= 1 }, 2*time.Minute, 10*time.Millisecond,
		"the subscriber dials again after losing its connection")
	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	select {
	case <-closed:
	case <-time.After(2 * time.Minute): // a liveness bound
		t.Fatal("Close did not return while the subscriber reconnected")
	}

	// The handshake goes on: the reconnection connects, after Close.
	release()
	require.Eventually(t, func() bool { return len(log.Lines("Connected to AMQP")) == 2 }, 2*time.Minute, 10*time.Millisecond,
		"the reconnection under way at Close connects")
	leaked := sub.Connection() // set before the line was logged
	require.False(t, leaked.IsClosed(), "upstream closed the connection its reconnection opened after Close: the gap is gone, update docs/rabbitmq.md")
	require.Eventually(t, func() bool { return proxy.Forwarding() == 1 }, time.Minute, 10*time.Millisecond,
		"one connection open: the closed subscriber's (the one Reset closed ends)")
	require.NoError(t, leaked.Close()) // what upstream's Close should have done
	require.Eventually(t, func() bool { return proxy.Forwarding() == 0 }, time.Minute, 10*time.Millisecond)
}
