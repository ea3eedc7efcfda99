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
