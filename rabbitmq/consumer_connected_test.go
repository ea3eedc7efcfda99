package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Connected follows the subscription's connection: false before Subscribe,
// true once it consumes, false while the broker cannot be reached (the
// connection reset and every new one swallowed), true again after the heal,
// false after Close. service.Service's readiness report reads it.
func TestConsumerConnectedFollowsTheConnection(t *testing.T) {
	t.Parallel()
	queue := declareQueue(t, "connected")
	proxy, url := testenv.ProxyAMQP(t)
	c, err := rabbitmq.NewConsumer(rabbitmq.WithReconnectBackoff(rabbitmq.ConsumerConfig{
		Connection: rabbitmq.Connection{URL: url, DialTimeout: 2 * time.Second},
	}, 100*time.Millisecond))
	require.NoError(t, err)
	require.False(t, c.Connected(), "no subscription yet")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = c.Subscribe(ctx, queue)
	require.NoError(t, err)
	require.Eventually(t, c.Connected, time.Minute, 10*time.Millisecond, "consuming")

	proxy.BlackHole()
	proxy.Reset()
	require.Eventually(t, func() bool { return !c.Connected() }, time.Minute, 10*time.Millisecond, "the connection was reset")

	proxy.Heal()
	require.Eventually(t, c.Connected, 2*time.Minute, 10*time.Millisecond, "reconnected after the heal")

	require.NoError(t, c.Close())
	require.False(t, c.Connected(), "closed")
}
