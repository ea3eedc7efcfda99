package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/metakeys"
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
		"sluice_event_id":           "evt-1",
		metakeys.DeathCount:         "3",
		metakeys.DeadLetterQueue:    "orders.retry.5m",
		metakeys.DeadLetterReason:   "expired",
		metakeys.FirstDeathQueue:    "orders.retry.30s",
		metakeys.FirstDeathReason:   "expired",
		metakeys.FirstDeathExchange: "",
		metakeys.DeliveryCount:      "3",
		metakeys.SourceExchange:     "orders",
		metakeys.SourceRoutingKey:   "orders.created",
		metakeys.Redelivered:        "true",
		"retries":                   "7",
		"big":                       "1099511627776",
		"urgent":                    "true",
		"ratio":                     "0.25",
		"sent_at":                   "2026-11-30T09:00:00Z",
		"price":                     "19.99",
		"raw":                       "bytes",
		"nested":                    `{"a":1,"b":["x",false]}`,
		"nothing":                   "",
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
		require.NotContains(t, k, metakeys.DeliveryPrefix, "delivery-scoped keys are not republished")
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

	sub, err := rabbitmq.NewWatermillSubscriber(rabbitmq.Connection{URL: testenv.AMQPURL})
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
	require.Equal(t, "3", got.Metadata.Get(metakeys.DeathCount))
	require.Equal(t, "true", got.Metadata.Get("urgent"))
	require.Equal(t, "false", got.Metadata.Get(metakeys.Redelivered), "delivered once, not nacked and redelivered")
	got.Ack()
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q) == 0 }, time.Minute, 20*time.Millisecond)
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

// StampTimestamp as the Marshaler's PostprocessPublishing: a message without
// a timestamp gets the time of its publish, one with metakeys.PropertyTimestamp keeps its
// own, and a copy republished from a consumed delivery keeps the first.
func TestStampTimestamp(t *testing.T) {
	t.Parallel()
	conn := testenv.AMQP(t)
	q := testenv.Name("stamp")
	_, err := testenv.Channel(t, conn).QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, q)
	stamping := rabbitmq.Marshaler{DefaultMarshaler: wamqp.DefaultMarshaler{PostprocessPublishing: rabbitmq.StampTimestamp}}
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Marshaler: stamping})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	before := time.Now().Truncate(time.Second)
	fresh := message.NewMessage("fresh", []byte(`{}`))
	own := message.NewMessage("own", []byte(`{}`))
	own.Metadata.Set(metakeys.PropertyTimestamp, "2026-01-02T03:04:05Z")
	require.NoError(t, pub.Publish(q, fresh, own))
	got := testenv.Drain(t, conn, q)
	require.Len(t, got, 2)
	require.False(t, got[0].Timestamp.Before(before), "stamped at the publish: %s", got[0].Timestamp)
	require.False(t, got[0].Timestamp.After(time.Now()))
	require.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), got[1].Timestamp.UTC(), "the producer's own is kept")

	copied, err := stamping.Unmarshal(got[0])
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond) // a later copy, a second later
	require.NoError(t, pub.Publish(q, copied))
	again := testenv.Drain(t, conn, q)
	require.Len(t, again, 1)
	require.Equal(t, got[0].Timestamp.UTC(), again[0].Timestamp.UTC(), "a copy keeps the first publish's time")
}
