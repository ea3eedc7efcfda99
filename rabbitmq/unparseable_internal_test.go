package rabbitmq

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/amqpframe"
	"github.com/sluicemq/sluice/internal/metakeys"
)

type nopAck struct{ amqp.Acknowledger }

// sluice_amqp_headers_error is the header the frame filter writes: the
// Marshaler reads it as the filter's reason, and drops it as a
// delivery-scoped key.
func TestTheFiltersKeyIsDeliveryScoped(t *testing.T) {
	t.Parallel()
	require.Equal(t, metakeys.HeadersError, amqpframe.Key)
	require.True(t, isDeliveryScoped(amqpframe.Key))
}

// A header of that name that the filter did not write (a delivery read
// without it, a producer's) is not believed, and not kept.
func TestUnmarshalUnparseableHeadersForged(t *testing.T) {
	t.Parallel()
	m, err := Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: nopAck{}, Headers: amqp.Table{metakeys.HeadersError: "forged", "a": "b"}})
	require.NoError(t, err)
	require.Empty(t, m.Metadata.Get(metakeys.HeadersError))
	require.Equal(t, "b", m.Metadata.Get("a"))
}

func TestConsumerPoisonQueueNeedsItsPublisher(t *testing.T) {
	t.Parallel()
	_, err := NewConsumer(ConsumerConfig{Connection: Connection{URL: "amqp://localhost"}, PoisonQueue: "q.poison"})
	require.ErrorIs(t, err, errNoPoisonQueue)
}
