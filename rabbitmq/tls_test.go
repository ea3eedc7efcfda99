package rabbitmq_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A broker behind TLS: the publisher, the subscriber and NewBroker connect
// with the configured roots, a round trip works, and without the roots the
// server's certificate is refused — the TLS is really verified. On a private
// node with a TLS listener (configuredNode).
func TestTLS(t *testing.T) {
	t.Parallel()
	node, pool := configuredNodeFor(t)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}

	_, err := rabbitmq.Dial(rabbitmq.Connection{URL: node.TLSURL, DialTimeout: 5 * time.Second}, "")
	require.Error(t, err, "the test CA is not a system root")
	_, err = rabbitmq.Dial(rabbitmq.Connection{URL: node.URL, TLS: cfg}, "")
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

	// Issue 42: a watermill-amqp config over amqps given to WithMarshaler
	// reads through the frame filter above TLS (below it, the filter would
	// read ciphertext): a message whose header array the client refuses
	// arrives with the reason, and the one behind it as sent.
	plain, err := amqp.Dial(node.URL)
	require.NoError(t, err)
	defer func() { _ = plain.Close() }()
	ch, err := plain.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("hostile", true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(ctx, "", "hostile", false, false, amqp.Publishing{MessageId: "hostile", Headers: amqp.Table{"arr": make([]any, 9000)}}))
	require.NoError(t, ch.PublishWithContext(ctx, "", "hostile", false, false, amqp.Publishing{MessageId: "good", Headers: amqp.Table{"k": "v"}}))
	wc := wamqp.NewDurableQueueConfig(node.TLSURL)
	wc.Connection.TLSConfig = cfg
	wc, err = rabbitmq.WithMarshaler(wc)
	require.NoError(t, err)
	sub, err := wamqp.NewSubscriber(wc, watermill.NopLogger{})
	require.NoError(t, err)
	defer func() { _ = sub.Close() }()
	msgs, err = sub.Subscribe(ctx, "hostile")
	require.NoError(t, err)
	for _, want := range []string{"hostile", "good"} {
		select {
		case got := <-msgs:
			require.Equal(t, want, got.UUID)
			if want == "hostile" {
				require.Contains(t, got.Metadata.Get(metakeys.HeadersError), `header "arr": an array of more than 8192 items`)
			} else {
				require.Equal(t, "v", got.Metadata.Get("k"))
			}
			got.Ack()
		case <-ctx.Done():
			t.Fatalf("%s not consumed over TLS through WithMarshaler", want)
		}
	}
}
