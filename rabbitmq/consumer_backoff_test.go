package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A subscription whose connection fails after it was consuming reconnects
// after the first ReconnectBackoff, however many failures came before — a
// consumer on a cluster moves to another node each time its node dies.
// Before, the backoff doubled on every failure for the subscription's whole
// life: the fourth reset here waited 8 × ReconnectBackoff (2.4 s), the
// fifth 16 × (4.8 s), and the test failed.
func TestConsumerBackoffStartsAgainAfterAConnectionThatConsumed(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	q := declareQueue(t, "consumer_backoff")
	const backoff = 300 * time.Millisecond
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: url, DialTimeout: 5 * time.Second}, ReconnectBackoff: backoff})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	deliveries, err := c.Subscribe(ctx, q)
	require.NoError(t, err)
	pub := newPublisher(t, "")

	for i := range 6 {
		start := time.Now()
		if i > 0 {
			proxy.Heal() // resets the subscription's connection
		}
		sent := msgs(1)[0]
		require.NoError(t, pub.Publish(q, sent))
		timeout := time.After(30 * time.Second)
		for got := false; !got; { // a message acked just before a reset comes again
			select {
			case msg := <-deliveries:
				msg.Ack()
				got = msg.UUID == sent.UUID
			case <-timeout:
				t.Fatalf("reset %d: the message not delivered in 30 s", i)
			}
		}
		if i > 0 {
			took := time.Since(start)
			require.Less(t, took, 2*time.Second, "reset %d: consuming again after %s", i, took)
			t.Logf("reset %d: consuming again after %s", i, took.Round(time.Millisecond))
		}
	}
}
