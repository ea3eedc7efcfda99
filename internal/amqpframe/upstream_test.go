package amqpframe

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// The reproduction docs/rabbitmq.md gives upstream, run as written on the
// shared RabbitMQ without the filter: the consumer's connection is closed,
// and "next", behind the 9,000-item array, never arrives.
func TestUpstreamAloneLosesItsConnectionToAHugeHeaderArray(t *testing.T) {
	ctx := t.Context()
	conn, _ := amqp.Dial("amqp://guest:guest@localhost:5672/")
	ch, _ := conn.Channel()
	q, _ := ch.QueueDeclare("", false, true, true, false, nil)
	_ = ch.PublishWithContext(ctx, "", q.Name, false, false,
		amqp.Publishing{Headers: amqp.Table{"arr": make([]any, 9000)}}) // the writer has no limit
	_ = ch.PublishWithContext(ctx, "", q.Name, false, false, amqp.Publishing{Body: []byte("next")})
	ds, _ := ch.Consume(q.Name, "", true, false, false, false, nil)
	<-ds // never: the connection is closed with 501 FRAME_ERROR
	t.Cleanup(func() { _ = conn.Close() })
	select {
	case d, open := <-ds:
		require.False(t, open, "the deliveries end without a delivery: %q", d.Body)
	case <-time.After(time.Minute):
		t.Fatal("the connection stayed up")
	}
	require.True(t, conn.IsClosed(), "the client closed its connection")
}
