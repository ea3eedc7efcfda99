package rabbitmq_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/rabbitmq"
)

// partitionedLedger declares a partitioned topology, publishes one message
// to it and lists the partitions a handler each consumes.
func partitionedLedger(ctx context.Context, url string, msg *message.Message) error {
	b, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: url},
		Topology: rabbitmq.TopologyConfig{
			Queue: "ledger", Quorum: true, DeliveryLimit: 20,
			Partitions: 8, PartitionKey: "account_id", // the header that is hashed
		},
	})
	if err != nil {
		return err // rabbitmq.ErrConsistentHashPlugin: enable the plugin
	}
	defer func() { _ = b.Close() }()
	// producers: to the exchange "ledger", with the header set
	msg.Metadata.Set("account_id", "acct-42")
	if err := b.PartitionPublisher().Publish("ledger", msg); err != nil {
		return err
	}
	// consumers: one handler per partition, each b.Partitions()[i] a broker.Broker
	for i, part := range b.Partitions() {
		fmt.Println(i, part.Endpoints().Topic) // ledger.p0 … ledger.p7
	}
	return nil
}

// Partitions: order per key across instances (compiled, not run: it
// declares queues of a fixed name).
func Example_partitions() {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":10}`))
	if err := partitionedLedger(context.Background(), "amqp://guest:guest@localhost:5672/", msg); err != nil {
		panic(err)
	}
}
