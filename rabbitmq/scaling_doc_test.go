package rabbitmq_test

import (
	"context"

	"github.com/sluicemq/sluice/rabbitmq"
)

// newClusterBroker is docs/scaling.md's snippet, compiled (its nodes are
// the doc's, so it is not run: ExampleDial_nodes and the cluster tests run
// Connection.URLs).
func newClusterBroker(ctx context.Context) (*rabbitmq.Broker, error) {
	b, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URLs: []string{
			"amqp://app:secret@rabbit-1:5672/",
			"amqp://app:secret@rabbit-2:5672/",
			"amqp://app:secret@rabbit-3:5672/",
		}},
		Topology: rabbitmq.TopologyConfig{Queue: "orders", Quorum: true, DeliveryLimit: 20},
	})
	return b, err
}

var _ = newClusterBroker
