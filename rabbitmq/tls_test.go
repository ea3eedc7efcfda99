package rabbitmq_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A broker behind TLS: the publisher, the subscriber and NewBroker connect
// with the configured roots, a round trip works, and without the roots the
// server's certificate is refused — the TLS is really verified. On a private
// node with a TLS listener.
func TestTLS(t *testing.T) {
	t.Parallel()
	files, pool := testenv.TestCA(t)
	node := testenv.StartPrivateRabbitMQWith(t, testenv.PrivateRabbitMQOptions{TLS: &files})
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}

	_, err := rabbitmq.Dial(rabbitmq.DialConfig{Connection: rabbitmq.Connection{URL: node.TLSURL, DialTimeout: 5 * time.Second}})
	require.Error(t, err, "the test CA is not a system root")
	_, err = rabbitmq.Dial(rabbitmq.DialConfig{Connection: rabbitmq.Connection{URL: node.URL, TLS: cfg}})
	require.ErrorContains(t, err, "needs an amqps:// URL")

	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: node.TLSURL, TLS: cfg}, Topology: rabbitmq.TopologyConfig{Queue: "orders"}})
	require.NoError(t, err)
	defer func() { _ = b.Close() }()
	m := message.NewMessage(watermill.NewUUID(), []byte("over TLS"))
	require.NoError(t, b.Publisher().Publish("orders", m))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msgs, err := b.Endpoints().Subscriber.Subscribe(ctx, "orders")
	require.NoError(t, err)
	select {
	case got := <-msgs:
		require.Equal(t, "over TLS", string(got.Payload))
		got.Ack()
	case <-ctx.Done():
		t.Fatal("nothing consumed over TLS")
	}
}
