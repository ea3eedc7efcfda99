package rabbitmq

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	amqp "github.com/sluicemq/sluice/internal/amqp091"
	"github.com/sluicemq/sluice/poison"
)

// The Consumer writes the poison stage's diagnosis keys without importing
// the stage: they must be the same.
func TestIsolatedCopyUsesThePoisonStagesKeys(t *testing.T) {
	t.Parallel()
	require.Equal(t, poison.ClassKey, poisonClassKey)
	require.Equal(t, poison.ReasonKey, poisonReasonKey)
	require.Equal(t, poison.QueueKey, poisonQueueKey)
	require.Equal(t, poison.ExchangeKey, poisonExchangeKey)
	require.Equal(t, poison.RoutingKeyKey, poisonRoutingKeyKey)
	require.Equal(t, poison.DroppedKey, poisonDroppedKey)
	require.Equal(t, poison.PoisonedAtKey, poisonedAtKey)
}

type nopAck struct{ amqp.Acknowledger }

// A delivery whose headers the client dropped reads as a message with the
// reason in HeadersErrorKey and no header; a producer cannot set that key.
func TestUnmarshalUnparseableHeaders(t *testing.T) {
	t.Parallel()
	m, err := Marshaler{}.UnmarshalDelivery(amqp.Delivery{Acknowledger: nopAck{}, MessageId: "m-1",
		HeadersError: errors.New(`headers not parsed: header "tags": an array of more than 8192 items (the client's limit)`)})
	require.NoError(t, err)
	require.Equal(t, `headers unparseable: header "tags": an array of more than 8192 items (the client's limit)`, m.Metadata.Get(HeadersErrorKey))
	require.Equal(t, "m-1", m.UUID)

	m, err = Marshaler{}.UnmarshalDelivery(amqp.Delivery{Acknowledger: nopAck{}, Headers: amqp.Table{HeadersErrorKey: "forged"}})
	require.NoError(t, err)
	require.Empty(t, m.Metadata.Get(HeadersErrorKey))
}

func TestConsumerPoisonQueueNeedsItsPublisher(t *testing.T) {
	t.Parallel()
	_, err := NewConsumer(ConsumerConfig{Connection: Connection{URL: "amqp://localhost"}, PoisonQueue: "q.poison"})
	require.ErrorIs(t, err, errNoPoisonQueue)
}
