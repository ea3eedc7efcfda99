package rabbitmq

import "github.com/sluicemq/sluice/broker"

// waits returns the tier queues, in order: each tier's, or each wait of a
// jittered tier, longest first.
func (t *Topology) waits() []broker.Wait {
	var ws []broker.Wait
	for _, tier := range t.tiers {
		if len(tier.Waits) == 0 {
			ws = append(ws, broker.Wait{Delay: tier.Delay, Topic: tier.Topic})
		}
		ws = append(ws, tier.Waits...)
	}
	return ws
}

// QueueRole is what a queue of a topology is for.
type QueueRole string

// The roles of a topology's queues.
const (
	RoleMain   QueueRole = "main"   // the consumer's queue
	RoleTier   QueueRole = "tier"   // a retry tier's queue (several for a jittered tier)
	RolePoison QueueRole = "poison" // the poison queue
)

// TopologyQueue is one queue of a topology.
type TopologyQueue struct {
	Name string
	Role QueueRole
	// Tier is the name of the retry tier of a tier queue ("30s"), whose
	// Name may be one of the tier's waits ("<Queue>.retry.28s").
	Tier string
}

// Queues returns every queue of the topology with its role, in the order
// Declare declares them: the consumer's queue, each tier's queues, the
// poison queue.
//
// With Partitions: each partition's queue (RoleMain) and its tiers, in
// order, then the shared poison queue.
func (t *Topology) Queues() []TopologyQueue {
	if len(t.parts) > 0 {
		var qs []TopologyQueue
		for _, p := range t.parts {
			pq := p.Queues()
			qs = append(qs, pq[:len(pq)-1]...)
		}
		return append(qs, TopologyQueue{Name: t.cfg.PoisonQueue, Role: RolePoison})
	}
	qs := []TopologyQueue{{Name: t.cfg.Queue, Role: RoleMain}}
	for _, tier := range t.tiers {
		for _, topic := range tier.Topics() {
			qs = append(qs, TopologyQueue{Name: topic, Role: RoleTier, Tier: tier.Name})
		}
	}
	return append(qs, TopologyQueue{Name: t.cfg.PoisonQueue, Role: RolePoison})
}
