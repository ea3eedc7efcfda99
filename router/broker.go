package router

import (
	"cmp"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/retrytiers"
)

// Tier is one retry tier a broker provides: a copy published to Topic comes
// back to the queue after Delay. It is retrytiers.Tier, named here so that a
// broker package needs only this one.
type Tier = retrytiers.Tier

// Broker is what a broker gives the stages of one consumer queue. A broker
// package (rabbitmq; the embedded default in this package) implements it;
// router imports no broker client, and a new broker is a new package.
type Broker interface {
	// Endpoints returns the queue's endpoints. Add calls it once per call.
	Endpoints() Endpoints
}

// Endpoints are what Add gives the stages of a handler consuming one queue,
// where the stage's own configuration leaves them unset.
type Endpoints struct {
	// System is messaging.system on spans ("rabbitmq", "gochannel").
	System string
	// Topic is the queue the handler consumes, and Subscriber its subscriber.
	Topic      string
	Subscriber message.Subscriber
	// Tiers are the retry tiers in order, and RetryPublisher publishes the
	// copies into them; it returns only once a copy is stored.
	Tiers          []Tier
	RetryPublisher message.Publisher
	// PoisonTopic is the poison queue, and PoisonPublisher publishes into it;
	// it returns only once a copy is stored and routed.
	PoisonTopic     string
	PoisonPublisher message.Publisher
	// Consumers is how many competing consumers Add starts by default, and
	// MaxConsumers the most the broker allows (0: no limit).
	Consumers, MaxConsumers int
}

// Gate tells a subscriber when to stop consuming: Engaged reports whether to
// stop now and returns a channel closed at the next change. The brake
// (*brake.Brake) is one.
type Gate interface {
	Engaged() (engaged bool, changed <-chan struct{})
}

// ProbingGate is a Gate that also says when it lets one delivery through as
// a probe (*brake.Brake is one). A subscriber that reads it takes one
// delivery at a time while Probing holds (rabbitmq.Consumer consumes with
// prefetch 1), so a failed probe gives back one delivery rather than every
// delivery prefetched beside it, and takes its full prefetch again once the
// gate releases.
type ProbingGate interface {
	Gate
	Probing() bool
}

// GatedSubscriber is a subscriber that can stop consuming while a gate is
// engaged (rabbitmq.Consumer). Add gives it the handler's brake:
// WithGate returns the subscriber the handler consumes from, and closing it
// closes the subscriber.
type GatedSubscriber interface {
	message.Subscriber
	WithGate(g Gate) message.Subscriber
}

// withEndpoints returns s with the broker's publishers, topics, tiers and
// messaging system filled in where the chosen stages leave them unset.
func (s Stages) withEndpoints(e Endpoints) Stages {
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

// TierDelaysDefault are the retry tiers' delays when a broker is given none:
// 30s → 5m → 30m (retrytiers.DelaysDefault).
var TierDelaysDefault = retrytiers.DelaysDefault

// TierName is the name of the tier of delay d: "30s", "5m", "1h30m".
func TierName(d time.Duration) string { return retrytiers.TierName(d) }
