package rabbitmq_test

import (
	"fmt"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"

	"github.com/sluicemq/sluice/rabbitmq"
)

// The queues of one consumer queue, printed as rabbitmqctl policies for
// operators who manage queue arguments by policy.
func ExampleTopology_Plan() {
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{
		Queue:      "inventory",
		TierDelays: []time.Duration{30 * time.Second, 5 * time.Minute},
	})
	if err != nil {
		panic(err)
	}
	for _, tier := range topo.Tiers() {
		fmt.Println(tier.Name, tier.Topic)
	}
	fmt.Println(topo.Config().PoisonQueue)
	for _, line := range topo.Plan().Policies {
		fmt.Println(line)
	}
	// Output:
	// 30s inventory.retry.30s
	// 5m inventory.retry.5m
	// inventory.poison
	// rabbitmqctl set_policy --apply-to queues --priority 10 sluice-inventory-retry-30s '^inventory\.retry\.30s$' '{"dead-letter-exchange":"","dead-letter-routing-key":"inventory","message-ttl":30000}'
	// rabbitmqctl set_policy --apply-to queues --priority 10 sluice-inventory-retry-5m '^inventory\.retry\.5m$' '{"dead-letter-exchange":"","dead-letter-routing-key":"inventory","message-ttl":300000}'
}

// A publisher whose messages carry the time of their publish as the AMQP
// timestamp (unless the producer set one), so that RabbitMQ reports how long
// each classic queue's head has waited.
func ExampleStampTimestamp() {
	url := "amqp://guest:guest@127.0.0.1:5672/"
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url},
		Marshaler: rabbitmq.Marshaler{DefaultMarshaler: wamqp.DefaultMarshaler{PostprocessPublishing: rabbitmq.StampTimestamp}}})
	if err != nil {
		panic(err)
	}
	defer func() { _ = pub.Close() }()
}
