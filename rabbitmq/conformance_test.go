package rabbitmq_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/broker/brokertest"
	"github.com/sluicemq/sluice/internal/poisonqueue"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// rabbitmq.NewBroker passes the broker conformance suite on a queue of
// each subtest's own.
func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, func(t *testing.T) brokertest.Broker {
		queue := testenv.Name("conformance")
		b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
			Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
			Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
		})
		require.NoError(t, err)
		queues := []string{queue, queue + poisonqueue.Suffix}
		for _, tier := range b.Endpoints().Tiers {
			queues = append(queues, tier.Topics()...)
		}
		testenv.DeleteQueuesAtEnd(t, queues...)
		t.Cleanup(func() { _ = b.Close() })
		return brokertest.Broker{Broker: b, Input: inputOf{b.Publisher()}}
	})
}

// inputOf is the broker's publisher, closed by the broker.
type inputOf struct{ message.Publisher }

func (inputOf) Close() error { return nil }
