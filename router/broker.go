package router

import (
	"cmp"

	"github.com/sluicemq/sluice/broker"
)

// withEndpoints returns s with the broker's publishers, topics, tiers and
// messaging system filled in where the chosen stages leave them unset.
func (s Stages) withEndpoints(e broker.Endpoints) Stages {
	if s.Poison != nil {
		p := *s.Poison
		p.Publisher = cmp.Or(p.Publisher, e.PoisonPublisher)
		p.Topic = cmp.Or(p.Topic, e.PoisonTopic)
		p.Queue = cmp.Or(p.Queue, e.Topic)
		if p.ParkTopic == "" && !p.DisablePark && len(e.Tiers) > 0 {
			p.ParkTopic, p.ParkPublisher = e.Tiers[0].Topic, cmp.Or(p.ParkPublisher, e.RetryPublisher)
		}
		s.Poison = &p
	}
	if s.Retry != nil {
		rt := *s.Retry
		rt.Publisher = cmp.Or(rt.Publisher, e.RetryPublisher)
		if rt.Tiers == nil {
			rt.Tiers = e.Tiers
		}
		s.Retry = &rt
	}
	if s.Trace != nil && s.Trace.System == "" {
		t := *s.Trace
		t.System = e.System
		s.Trace = &t
	}
	return s
}
