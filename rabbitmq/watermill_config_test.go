package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A service's own watermill-amqp Config, given Sluice's Marshaler in one
// call, keeps declaring its queue and reads a Spring producer's integer
// header: the handler gets the message once, with the header as text and
// the UUID from the service's own UUID header (its DefaultMarshaler's
// setting kept).
func TestWithMarshalerKeepsTheServicesConfigAndReadsIntegerHeaders(t *testing.T) {
	t.Parallel()
	q := testenv.Name("own_config")
	testenv.DeleteQueuesAtEnd(t, q)
	own := wamqp.NewDurableQueueConfig(testenv.AMQPURL) // declares the queue named by the topic
	own.Marshaler = wamqp.DefaultMarshaler{MessageUUIDHeaderKey: "message_uuid"}
	cfg, err := rabbitmq.WithMarshaler(own)
	require.NoError(t, err)
	require.Equal(t, rabbitmq.Marshaler{DefaultMarshaler: wamqp.DefaultMarshaler{MessageUUIDHeaderKey: "message_uuid"}}, cfg.Marshaler)

	sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	out, err := sub.Subscribe(ctx, q) // the service's config declares q
	require.NoError(t, err)

	conn := testenv.AMQP(t)
	require.NoError(t, testenv.Channel(t, conn).PublishWithContext(ctx, "", q, true, false, amqp.Publishing{
		ContentType: "application/json", Type: "order.created", DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{"__TypeId__": "com.example.OrderCreated", "schemaVersion": int32(2), "message_uuid": "uuid-7"},
		Body:    []byte(`{"orderId":"o-1"}`),
	}))
	var got *message.Message
	select {
	case got = <-out:
	case <-ctx.Done():
		t.Fatal("no delivery: the marshaler refused it")
	}
	require.Equal(t, "uuid-7", got.UUID)
	require.Equal(t, "2", got.Metadata.Get("schemaVersion"))
	require.Equal(t, "com.example.OrderCreated", got.Metadata.Get(sluice.EventTypeKey))
	require.Equal(t, "false", got.Metadata.Get(metakeys.Redelivered), "read at its first delivery, not nacked and redelivered")
	got.Ack()
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q) == 0 }, time.Minute, 20*time.Millisecond)
}

// What WithMarshaler carries, and what it refuses naming the field.
func TestWithMarshalerCarriesOrRefuses(t *testing.T) {
	t.Parallel()
	post := func(p amqp.Publishing) amqp.Publishing { return p }
	for name, tc := range map[string]struct {
		in        wamqp.Marshaler
		noRequeue bool
		want      wamqp.Marshaler
		refused   string
	}{
		"nil":                  {in: nil, want: rabbitmq.Marshaler{}},
		"default":              {in: wamqp.DefaultMarshaler{NotPersistentDeliveryMode: true}, want: rabbitmq.Marshaler{DefaultMarshaler: wamqp.DefaultMarshaler{NotPersistentDeliveryMode: true}}},
		"pointer to default":   {in: &wamqp.DefaultMarshaler{MessageUUIDHeaderKey: "id"}, want: rabbitmq.Marshaler{DefaultMarshaler: wamqp.DefaultMarshaler{MessageUUIDHeaderKey: "id"}}},
		"sluice's, kept":       {in: rabbitmq.Marshaler{Map: rabbitmq.Mapping{EventID: []rabbitmq.Source{rabbitmq.Header("id")}}}, want: rabbitmq.Marshaler{Map: rabbitmq.Mapping{EventID: []rabbitmq.Source{rabbitmq.Header("id")}}}},
		"correlating":          {in: wamqp.CorrelatingMarshaler{PostprocessPublishing: post}, refused: "Config.Marshaler is a amqp.CorrelatingMarshaler"},
		"no requeue on a nack": {in: wamqp.DefaultMarshaler{}, noRequeue: true, refused: "Config.Consume.NoRequeueOnNack"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := wamqp.NewDurableQueueConfig(testenv.AMQPURL)
			cfg.Marshaler = tc.in
			cfg.Consume.NoRequeueOnNack = tc.noRequeue
			got, err := rabbitmq.WithMarshaler(cfg)
			if tc.refused != "" {
				require.ErrorContains(t, err, tc.refused)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got.Marshaler)
			require.Equal(t, cfg.TopologyBuilder, got.TopologyBuilder, "the declarations are kept")
		})
	}
}

// Subscribe on a queue that does not exist fails, naming it, with both of
// Sluice's subscribers — before, watermill-amqp's retried NOT_FOUND every
// 100 ms and the Consumer every backoff, each Subscribe returning no error.
func TestSubscribeOnAMissingQueueFailsNamingIt(t *testing.T) {
	t.Parallel()
	missing := testenv.Name("never_declared")
	sub, err := rabbitmq.NewWatermillSubscriber(rabbitmq.Connection{URL: testenv.AMQPURL})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	for name, s := range map[string]message.Subscriber{"WatermillSubscriber": sub, "Consumer": c} {
		_, err := s.Subscribe(t.Context(), missing)
		require.ErrorIs(t, err, rabbitmq.ErrQueueNotFound, name)
		require.ErrorContains(t, err, `"`+missing+`"`, name)
	}
}
