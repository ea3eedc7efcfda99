package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

var brokerHeaders = amqp.Table{
	"_watermill_message_uuid": "uuid-1",
	"sluice_event_id":         "evt-1",
	"x-death": []any{
		amqp.Table{"count": int64(2), "queue": "orders.retry.5m", "reason": "expired", "exchange": "", "time": time.Unix(1700000000, 0)},
		amqp.Table{"count": int64(1), "queue": "orders.retry.30s", "reason": "expired", "exchange": ""},
	},
	"x-first-death-queue":    "orders.retry.30s",
	"x-first-death-reason":   "expired",
	"x-first-death-exchange": "",
	"x-delivery-count":       int64(3),
	"retries":                int32(7),
	"big":                    int64(1) << 40,
	"urgent":                 true,
	"ratio":                  0.25,
	"sent_at":                time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC),
	"price":                  amqp.Decimal{Scale: 2, Value: 1999},
	"raw":                    []byte("bytes"),
	"nested":                 amqp.Table{"a": int16(1), "b": []any{"x", false}},
	"nothing":                nil,
	"sluice_amqp_exchange":   "stale value from a republished copy",
}

func TestMarshalerUnmarshalsBrokerHeaders(t *testing.T) {
	t.Parallel()
	msg, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{
		Acknowledger: nopAcker{},
		Headers:      brokerHeaders, Body: []byte("{}"), Exchange: "orders", RoutingKey: "orders.created", Redelivered: true,
	})
	require.NoError(t, err)
	require.Equal(t, "uuid-1", msg.UUID)
	want := map[string]string{
		"sluice_event_id":              "evt-1",
		rabbitmq.DeathCountKey:         "3",
		rabbitmq.LastDeathQueueKey:     "orders.retry.5m",
		rabbitmq.LastDeathReasonKey:    "expired",
		rabbitmq.FirstDeathQueueKey:    "orders.retry.30s",
		rabbitmq.FirstDeathReasonKey:   "expired",
		rabbitmq.FirstDeathExchangeKey: "",
		rabbitmq.DeliveryCountKey:      "3",
		rabbitmq.ExchangeKey:           "orders",
		rabbitmq.RoutingKeyKey:         "orders.created",
		rabbitmq.RedeliveredKey:        "true",
		"retries":                      "7",
		"big":                          "1099511627776",
		"urgent":                       "true",
		"ratio":                        "0.25",
		"sent_at":                      "2026-11-30T09:00:00Z",
		"price":                        "19.99",
		"raw":                          "bytes",
		"nested":                       `{"a":1,"b":["x",false]}`,
		"nothing":                      "",
	}
	for k, v := range want {
		require.Equal(t, v, msg.Metadata.Get(k), k)
	}
	for k := range msg.Metadata {
		require.NotContains(t, k, "x-", "broker headers are not copied as metadata")
	}
	require.Len(t, msg.Metadata, len(want))

	pub, err := rabbitmq.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	require.Equal(t, "evt-1", pub.Headers["sluice_event_id"])
	require.Equal(t, "uuid-1", pub.Headers["_watermill_message_uuid"])
	require.Equal(t, amqp.Persistent, pub.DeliveryMode)
	for k := range pub.Headers {
		require.NotContains(t, k, rabbitmq.DeliveryPrefix, "delivery-scoped keys are not republished")
	}
}

// A delivery with x-death and typed headers reaches the handler through the
// subscriber, once, instead of being nacked in a loop.
func TestSubscriberHandlesTypedHeaders(t *testing.T) {
	t.Parallel()
	conn := testenv.AMQP(t)
	q := declareQueue(t, "typed_headers")
	ch := testenv.Channel(t, conn)
	require.NoError(t, ch.PublishWithContext(t.Context(), "", q, true, false, amqp.Publishing{
		Headers: brokerHeaders, Body: []byte(`{"ok":true}`), DeliveryMode: amqp.Persistent,
	}))

	sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{URL: testenv.AMQPURL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	out, err := sub.Subscribe(ctx, q)
	require.NoError(t, err)

	var got *message.Message
	select {
	case got = <-out:
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	require.Equal(t, "3", got.Metadata.Get(rabbitmq.DeathCountKey))
	require.Equal(t, "true", got.Metadata.Get("urgent"))
	require.Equal(t, "false", got.Metadata.Get(rabbitmq.RedeliveredKey), "delivered once, not nacked and redelivered")
	got.Ack()
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q) == 0 }, 5*time.Second, 20*time.Millisecond)
}

// nopAcker is the acknowledger of deliveries built by tests.
type nopAcker struct{}

func (nopAcker) Ack(uint64, bool) error        { return nil }
func (nopAcker) Nack(uint64, bool, bool) error { return nil }
func (nopAcker) Reject(uint64, bool) error     { return nil }

// A zero delivery — what amqp091 hands out on a closed deliveries channel
// after the server cancelled the consumer — is never a message.
func TestMarshalerRefusesAZeroDelivery(t *testing.T) {
	t.Parallel()
	_, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{})
	require.ErrorIs(t, err, rabbitmq.ErrNoDelivery)
}
