package rabbitmq_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Only the delivery's own properties set the property keys: a producer's
// header of such a name is dropped, whatever its value, and the properties
// are the real ones.
func TestMarshalerDropsPropertyHeaders(t *testing.T) {
	t.Parallel()
	msg, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{
		Acknowledger: nopAcker{},
		Headers: amqp.Table{
			metakeys.PropertyPriority:           "high",
			metakeys.PropertyContentType:        "text/forged",
			metakeys.PropertyUserID:             "admin",
			metakeys.PropertyTimestamp:          "yesterday",
			metakeys.PropertyPrefix + "unknown": "x",
			"sluice_event_id":                   "evt-1",
		},
		ContentType: "application/json", Priority: 3,
	})
	require.NoError(t, err)
	require.Equal(t, "application/json", msg.Metadata.Get(metakeys.PropertyContentType), "the real property")
	require.Equal(t, "3", msg.Metadata.Get(metakeys.PropertyPriority), "the real property")
	for _, k := range []string{metakeys.PropertyUserID, metakeys.PropertyTimestamp, metakeys.PropertyPrefix + "unknown"} {
		_, ok := msg.Metadata[k]
		require.False(t, ok, "%s: no such property on the delivery, and the header is dropped", k)
	}
	_, err = rabbitmq.Marshaler{}.Marshal(msg)
	require.NoError(t, err, "a copy of it can be built")
}

// A copy Sluice publishes carries the producer's validated user id as
// metakeys.OriginUserID (RabbitMQ refuses a foreign user_id property); what AMQP
// cannot carry is an UnpublishableError naming the key, never the value.
func TestMarshalerUnpublishableNamesTheKey(t *testing.T) {
	t.Parallel()
	m := message.NewMessage("u", nil)
	m.Metadata.Set(metakeys.PropertyUserID, "orders-svc")
	pub, err := rabbitmq.Marshaler{}.Marshal(m)
	require.NoError(t, err)
	require.Equal(t, "orders-svc", pub.Headers[metakeys.OriginUserID])
	require.Empty(t, pub.UserId)
	require.NotContains(t, pub.Headers, metakeys.PropertyUserID)

	long := strings.Repeat("k", 300)
	for key, value := range map[string]string{
		metakeys.PropertyPriority:           "high-and-secret",
		metakeys.PropertyTimestamp:          "secret-time",
		metakeys.PropertyContentType:        strings.Repeat("secret", 50),
		metakeys.PropertyPrefix + "unknown": "secret",
		long:                                "v",
	} {
		m := message.NewMessage("u", nil)
		m.Metadata.Set(key, value)
		_, err := rabbitmq.Marshaler{}.Marshal(m)
		require.ErrorIs(t, err, sluice.ErrUnpublishable, key)
		ue, ok := errors.AsType[*sluice.UnpublishableError](err)
		require.True(t, ok)
		require.Equal(t, key, ue.Key)
		require.NotContains(t, err.Error(), "secret", "the offending value is not in the error")
		require.Less(t, len(err.Error()), 200, "the key is bounded")
	}
}

// Issue 18 item 2: 20 messages with a forged sluice_property_priority
// header, each failing once, ahead of 20 good ones. Their tier copies are
// built and each comes back once; every good message is processed; nothing
// is poisoned. Before the fix every copy failed to marshal and the stage
// nacked them back to the head of the queue: no copy, no progress.
func TestForgedPropertyHeaderDoesNotStarveTheQueue(t *testing.T) {
	t.Parallel()
	s := newBrokerStack(t, func(msg *message.Message) error {
		if strings.HasPrefix(msg.Metadata.Get(sluice.EventIDKey), "forged-") && msg.Metadata.Get(sluice.AttemptKey) == "" {
			return sluice.Transient(errStockTimeout)
		}
		return nil
	})
	for i := range 20 {
		s.publishRaw(t, amqp.Publishing{Headers: amqp.Table{
			sluice.EventIDKey: "forged-" + string(rune('a'+i)), metakeys.PropertyPriority: "high", metakeys.PropertyTimestamp: "never",
		}})
	}
	for i := range 20 {
		s.publishRaw(t, amqp.Publishing{Headers: amqp.Table{sluice.EventIDKey: "good-" + string(rune('a'+i))}})
	}
	for i := range 20 {
		s.handled(t, "good-"+string(rune('a'+i)), 1)
		s.handled(t, "forged-"+string(rune('a'+i)), 2)
	}
	s.settled(t, 0)
	for _, d := range s.deliveries("forged-a") {
		require.Empty(t, d.Metadata.Get(metakeys.PropertyPriority), "the forged header is no property")
		require.Empty(t, d.Metadata.Get(metakeys.PropertyTimestamp))
	}
	require.Equal(t, "2", s.deliveries("forged-a")[1].Metadata.Get(sluice.AttemptKey), "the tier's copy")
}

// A copy that cannot be built — the handler left metadata AMQP cannot
// carry — is poisoned with its reason (the key, not the value), its poison
// copy leaving out that key: handled once, never nacked back to the head.
func TestUnbuildableCopyIsPoisoned(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("n", 300)
	s := newBrokerStack(t, func(msg *message.Message) error {
		switch msg.Metadata.Get(sluice.EventIDKey) {
		case "bad-priority":
			msg.Metadata.Set(metakeys.PropertyPriority, "urgent-secret")
		case "long-name":
			msg.Metadata.Set(long, "v")
		}
		return sluice.Transient(errStockTimeout)
	})
	s.publishRaw(t, amqp.Publishing{Headers: amqp.Table{sluice.EventIDKey: "bad-priority"}})
	s.publishRaw(t, amqp.Publishing{Headers: amqp.Table{sluice.EventIDKey: "long-name"}})
	s.handled(t, "bad-priority", 1)
	s.handled(t, "long-name", 1)
	got := s.settled(t, 2)
	byID := map[string]amqp.Delivery{}
	for _, d := range got {
		byID[d.Headers[sluice.EventIDKey].(string)] = d
	}
	for id, key := range map[string]string{"bad-priority": metakeys.PropertyPriority, "long-name": long} {
		d := byID[id]
		require.Equal(t, "poison", d.Headers["sluice_poison_class"], id)
		reason := d.Headers["sluice_poison_reason"].(string)
		require.Contains(t, reason, "retry copy cannot be published", id)
		require.Contains(t, reason, key[:min(len(key), 40)], id)
		require.NotContains(t, reason, "secret", id)
		require.NotContains(t, d.Headers, key, id)
		require.Equal(t, uint8(0), d.Priority, id)
		require.Len(t, s.deliveries(id), 1, "%s: handled once, not nacked in a loop", id)
	}
	require.Contains(t, byID["long-name"].Headers["sluice_poison_dropped"], long[:40])
	require.Contains(t, byID["bad-priority"].Headers["sluice_poison_dropped"], metakeys.PropertyPriority)

}
