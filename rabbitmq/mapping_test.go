package rabbitmq_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/rabbitmq"
)

// springDelivery is what Spring AMQP's Jackson converter publishes: the
// class in __TypeId__, the type, correlation and message id properties.
func springDelivery() amqp.Delivery {
	return amqp.Delivery{
		Acknowledger:  nopAcker{},
		Type:          "order.created",
		CorrelationId: "corr-42",
		MessageId:     "spring-msg-1",
		Headers:       amqp.Table{rabbitmq.SpringTypeIDHeader: "com.example.OrderCreated", "retries": int32(0)},
		Body:          []byte(`{"id":1}`),
	}
}

func unmarshal(t *testing.T, m rabbitmq.Marshaler, d amqp.Delivery) message.Metadata {
	t.Helper()
	msg, err := m.Unmarshal(d)
	require.NoError(t, err)
	return msg.Metadata
}

func TestMappingDefaults(t *testing.T) {
	t.Parallel()
	md := unmarshal(t, rabbitmq.Marshaler{}, springDelivery())
	require.Equal(t, "com.example.OrderCreated", md.Get(sluice.EventTypeKey), "__TypeId__ first")
	require.Equal(t, "corr-42", md.Get(middleware.CorrelationIDMetadataKey))
	require.Equal(t, "corr-42", middleware.MessageCorrelationID(&message.Message{Metadata: md}))
	require.Empty(t, md.Get(sluice.EventIDKey), "a message id is not an event id unless asked")
	require.Equal(t, "order.created", md.Get(metakeys.PropertyType), "the property keys are kept")
	require.Equal(t, "corr-42", md.Get(metakeys.PropertyCorrelationID))

	d := springDelivery()
	delete(d.Headers, rabbitmq.SpringTypeIDHeader)
	require.Equal(t, "order.created", unmarshal(t, rabbitmq.Marshaler{}, d).Get(sluice.EventTypeKey), "the type property next")
}

func TestMappingKeepsTheMessagesOwn(t *testing.T) {
	t.Parallel()
	d := springDelivery()
	d.Headers[sluice.EventTypeKey] = "OrderCreated.v2"
	d.Headers[middleware.CorrelationIDMetadataKey] = "watermill-corr"
	d.Headers[sluice.EventIDKey] = "evt-1"
	md := unmarshal(t, rabbitmq.Marshaler{Map: rabbitmq.Mapping{EventID: []rabbitmq.Source{rabbitmq.PropertyMessageID}}}, d)
	require.Equal(t, "OrderCreated.v2", md.Get(sluice.EventTypeKey))
	require.Equal(t, "watermill-corr", md.Get(middleware.CorrelationIDMetadataKey))
	require.Equal(t, "evt-1", md.Get(sluice.EventIDKey))
}

func TestMappingConfigured(t *testing.T) {
	t.Parallel()
	off := []rabbitmq.Source{}
	md := unmarshal(t, rabbitmq.Marshaler{Map: rabbitmq.Mapping{EventType: off, CorrelationID: off}}, springDelivery())
	require.NotContains(t, md, sluice.EventTypeKey, "turned off")
	require.NotContains(t, md, middleware.CorrelationIDMetadataKey, "turned off")

	d := springDelivery()
	d.AppId = "orders-service"
	d.Headers["x-request-id"] = "req-7"
	md = unmarshal(t, rabbitmq.Marshaler{Map: rabbitmq.Mapping{
		EventType:     []rabbitmq.Source{rabbitmq.PropertyType},
		CorrelationID: []rabbitmq.Source{rabbitmq.Header("x-request-id")},
		EventID:       []rabbitmq.Source{rabbitmq.Header("missing"), rabbitmq.PropertyMessageID},
	}}, d)
	require.Equal(t, "order.created", md.Get(sluice.EventTypeKey))
	require.Equal(t, "req-7", md.Get(middleware.CorrelationIDMetadataKey), "an x- header can be a source")
	require.Equal(t, "spring-msg-1", md.Get(sluice.EventIDKey), "opted in; the first source present wins")
	require.Equal(t, "header __TypeId__", rabbitmq.Header(rabbitmq.SpringTypeIDHeader).String())
	require.Equal(t, "property message_id", rabbitmq.PropertyMessageID.String())
}

// A producer's values are hostile: one that is empty, too long, not UTF-8,
// with a control character (a terminal escape) or not a string is skipped
// for the next source, never cut short.
func TestMappingSkipsHostileValues(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]any{
		"empty":     "",
		"too long":  strings.Repeat("T", rabbitmq.MappedValueMaxLength+1),
		"not UTF-8": "type\xff",
		"escape":    "Order\x1b]0;pwned\x07",
		"newline":   "Order\nCreated",
		"integer":   int32(7),
		"table":     amqp.Table{"a": "b"},
	} {
		d := springDelivery()
		d.Headers[rabbitmq.SpringTypeIDHeader] = v
		md := unmarshal(t, rabbitmq.Marshaler{}, d)
		require.Equal(t, "order.created", md.Get(sluice.EventTypeKey), name)
	}
	d := springDelivery()
	d.Headers[rabbitmq.SpringTypeIDHeader] = strings.Repeat("T", rabbitmq.MappedValueMaxLength)
	require.Equal(t, strings.Repeat("T", rabbitmq.MappedValueMaxLength), unmarshal(t, rabbitmq.Marshaler{}, d).Get(sluice.EventTypeKey), "at the limit")

	d = springDelivery()
	d.CorrelationId = "corr\x1b[2J"
	require.NotContains(t, unmarshal(t, rabbitmq.Marshaler{}, d), middleware.CorrelationIDMetadataKey)
}

// A copy Sluice republishes (Marshal) reads back the same: the mapped keys
// travel as headers once, the properties as properties, whatever the
// reader's Mapping.
func TestMappingRoundTrip(t *testing.T) {
	t.Parallel()
	m := rabbitmq.Marshaler{Map: rabbitmq.Mapping{EventID: []rabbitmq.Source{rabbitmq.PropertyMessageID}}}
	msg, err := m.Unmarshal(springDelivery())
	require.NoError(t, err)
	pub, err := m.Marshal(msg)
	require.NoError(t, err)
	require.Equal(t, "com.example.OrderCreated", pub.Headers[sluice.EventTypeKey])
	require.Equal(t, "corr-42", pub.Headers[middleware.CorrelationIDMetadataKey])
	require.Equal(t, "corr-42", pub.CorrelationId)
	require.Equal(t, "order.created", pub.Type)

	again := amqp.Delivery{Acknowledger: nopAcker{}, Headers: pub.Headers, Type: pub.Type,
		CorrelationId: pub.CorrelationId, MessageId: pub.MessageId, Body: pub.Body}
	off := []rabbitmq.Source{}
	for _, reader := range []rabbitmq.Marshaler{m, {}, {Map: rabbitmq.Mapping{EventType: off, CorrelationID: off}}} {
		md := unmarshal(t, reader, again)
		for _, k := range []string{sluice.EventTypeKey, middleware.CorrelationIDMetadataKey, sluice.EventIDKey, metakeys.PropertyType, metakeys.PropertyCorrelationID} {
			require.Equal(t, msg.Metadata.Get(k), md.Get(k), k)
		}
	}
}
