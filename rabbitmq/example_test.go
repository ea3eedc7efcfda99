package rabbitmq_test

import (
	"fmt"
	"time"

	"github.com/sluicemq/sluice/rabbitmq"
)

// The queues of one consumer queue, printed as rabbitmqctl policies for
// operators who manage queue arguments by policy.
func ExampleTopology_Policies() {
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
	fmt.Println(topo.PoisonQueue())
	for _, line := range topo.Policies() {
		fmt.Println(line)
	}
	// Output:
	// 30s inventory.retry.30s
	// 5m inventory.retry.5m
	// inventory.poison
	// rabbitmqctl set_policy --apply-to queues --priority 10 sluice-inventory-retry-30s '^inventory\.retry\.30s$' '{"dead-letter-exchange":"","dead-letter-routing-key":"inventory","message-ttl":30000}'
	// rabbitmqctl set_policy --apply-to queues --priority 10 sluice-inventory-retry-5m '^inventory\.retry\.5m$' '{"dead-letter-exchange":"","dead-letter-routing-key":"inventory","message-ttl":300000}'
}
