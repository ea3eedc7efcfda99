package rabbitmq

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/amqpframe"
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

// HeadersErrorKey is the header the frame filter writes: the Marshaler
// reads it as the filter's reason, and drops it as a delivery-scoped key.
func TestHeadersErrorKeyIsTheFiltersKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, amqpframe.Key, HeadersErrorKey)
	require.True(t, isDeliveryScoped(amqpframe.Key))
}

// A header of that name that the filter did not write (a delivery read
// without it, a producer's) is not believed, and not kept.
func TestUnmarshalUnparseableHeadersForged(t *testing.T) {
	t.Parallel()
	m, err := Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: nopAck{}, Headers: amqp.Table{HeadersErrorKey: "forged", "a": "b"}})
	require.NoError(t, err)
	require.Empty(t, m.Metadata.Get(HeadersErrorKey))
	require.Equal(t, "b", m.Metadata.Get("a"))
}

func TestConsumerPoisonQueueNeedsItsPublisher(t *testing.T) {
	t.Parallel()
	_, err := NewConsumer(ConsumerConfig{Connection: Connection{URL: "amqp://localhost"}, PoisonQueue: "q.poison"})
	require.ErrorIs(t, err, errNoPoisonQueue)
}
