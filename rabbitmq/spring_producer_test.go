package rabbitmq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A Spring AMQP producer's message (the type property, __TypeId__,
// correlation_id, message_id, an integer header) consumed through the
// Consumer into a router with Watermill's CorrelationID middleware: the
// handler sees the event type and the correlation id, and the message it
// produces carries the same correlation id (issue 20, item 3: the type fed
// nothing and the middleware saw "").
func TestSpringProducerTypeAndCorrelationID(t *testing.T) {
	t.Parallel()
	in, out := declareQueue(t, "spring_in"), declareQueue(t, "spring_out")
	ch := testenv.Channel(t, testenv.AMQP(t))
	require.NoError(t, ch.PublishWithContext(t.Context(), "", in, false, false, amqp.Publishing{
		ContentType: "application/json", Type: "order.created", CorrelationId: "corr-42", MessageId: "spring-msg-1",
		Headers: amqp.Table{"__TypeId__": "com.example.OrderCreated", "retries": int32(3)},
		Body:    []byte(`{"id":1}`), DeliveryMode: amqp.Persistent,
	}))

	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, DrainTimeout: 10 * time.Second})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(middleware.CorrelationID)
	type seen struct{ eventType, correlationID, retries string }
	got := make(chan seen, 4)
	r.AddHandler("spring", in, c, out, newPublisher(t, ""), func(msg *message.Message) ([]*message.Message, error) {
		got <- seen{msg.Metadata.Get(sluice.EventTypeKey), middleware.MessageCorrelationID(msg), msg.Metadata.Get("retries")}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("priced"))}, nil
	})
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			require.NoError(t, r.Close())
			require.NoError(t, <-done)
			require.NoError(t, c.Close())
		})
	}
	t.Cleanup(stop)

	select {
	case s := <-got:
		require.Equal(t, seen{"com.example.OrderCreated", "corr-42", "3"}, s)
	case <-time.After(2 * time.Minute): // a liveness bound: the consumer connects and hands it out in well under a second idle
		t.Fatal("the handler never ran")
	}
	var produced amqp.Delivery
	require.Eventually(t, func() bool {
		d, ok, err := ch.Get(out, true)
		require.NoError(t, err)
		produced = d
		return ok
	}, time.Minute, 20*time.Millisecond, "the produced message")
	require.Equal(t, "corr-42", produced.Headers[middleware.CorrelationIDMetadataKey], "Watermill's middleware copied the producer's correlation id")
	stop()
	require.Equal(t, 0, testenv.QueueDepth(t, testenv.AMQP(t), in), "acked")
}
