package rabbitmq_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// proxiedPublisher is a Publisher connected to the broker through a proxy
// the test controls, already connected (one message confirmed to queue).
func proxiedPublisher(t *testing.T, queue string, confirmTimeout time.Duration) (*rabbitmq.Publisher, *testenv.Proxy) {
	t.Helper()
	proxy, url := testenv.ProxyAMQP(t)
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url}, ConfirmTimeout: confirmTimeout})
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Heal(); _ = p.Close() })
	// The warm-up opens the connection and channel through the proxy. Its
	// confirm has the short confirmTimeout too, which a loaded machine
	// overran once (300 ms, load ~14): it is tried again while uncertain —
	// a copy it may have stored is counted before the subtests read the
	// queue's depth.
	warmUp := func() error { return p.Publish(queue, message.NewMessage(watermill.NewUUID(), []byte("warm-up"))) }
	deadline := time.Now().Add(time.Minute)
	for err := warmUp(); err != nil; err = warmUp() {
		require.ErrorIs(t, err, sluice.ErrPublishUncertain, "the warm-up publish")
		require.True(t, time.Now().Before(deadline), "the warm-up publish, uncertain for a minute: %v", err)
	}
	return p, proxy
}

// A publish the broker stored but whose confirm never came back, and one
// whose connection closed before its confirm, are uncertain
// (sluice.ErrPublishUncertain); an unroutable one is certain.
func TestPublisherUncertainAndCertainFailures(t *testing.T) {
	t.Parallel()
	q := declareQueue(t, "uncertain")
	conn := testenv.AMQP(t)

	t.Run("confirm lost", func(t *testing.T) {
		p, proxy := proxiedPublisher(t, q, 300*time.Millisecond)
		before := testenv.QueueDepth(t, conn, q)
		proxy.DropReplies()
		err := p.Publish(q, message.NewMessage(watermill.NewUUID(), []byte("lost confirm")))
		require.ErrorIs(t, err, sluice.ErrPublishUncertain)
		require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q) == before+1 }, time.Minute, 10*time.Millisecond,
			"the broker stored the copy whose confirm was lost: why the error is uncertain")
	})
	t.Run("connection closed before the confirm", func(t *testing.T) {
		p, proxy := proxiedPublisher(t, q, 10*time.Second)
		before := testenv.QueueDepth(t, conn, q)
		proxy.DropReplies()
		errc := make(chan error, 1)
		go func() { errc <- p.Publish(q, message.NewMessage(watermill.NewUUID(), []byte("closed"))) }()
		require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q) > before }, time.Minute, 10*time.Millisecond,
			"the publish reached the broker")
		proxy.Heal() // resets the connection: the confirm can no longer come
		err := <-errc
		require.ErrorIs(t, err, rabbitmq.ErrChannelClosed)
		require.ErrorIs(t, err, sluice.ErrPublishUncertain)
	})
	t.Run("unroutable is certain", func(t *testing.T) {
		p, _ := proxiedPublisher(t, q, 10*time.Second)
		err := p.Publish(testenv.Name("missing"), message.NewMessage(watermill.NewUUID(), nil))
		var ue *rabbitmq.UnroutableError
		require.ErrorAs(t, err, &ue)
		require.NotErrorIs(t, err, sluice.ErrPublishUncertain)
	})
}
