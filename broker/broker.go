// Package broker is the contract between Sluice's stages and a broker: what
// the stages and router.Add need from one consumer queue (its subscriber,
// its retry tiers and poison queue, the confirmed publishers of the copies,
// a gate to stop consuming), and the retry ladder — the tiers' names,
// topics and delays — that every broker names the same way.
//
// It imports only the root package, Watermill's message package and the
// OpenTelemetry metric API. A
// broker (package rabbitmq, package embedded) implements Broker and imports
// this package, never router or a stage; the stages import it for Tier.
// A new broker is a new package beside them.
package broker

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
)

// Broker is what a broker gives the stages of one consumer queue
// (rabbitmq.Broker, embedded.Broker).
type Broker interface {
	// Endpoints returns the queue's endpoints. router.Add calls it once per
	// call.
	Endpoints() Endpoints
}

// Partitioned is a Broker whose queue is spread over partition queues by
// a key, each consumed by one consumer at a time across every instance
// (rabbitmq.Broker with TopologyConfig.Partitions: a consistent-hash
// exchange, single active consumer). Partitions returns one Broker per
// partition queue, in order: its Endpoints are the partition's — Topic
// the partition queue, its own Subscriber, its Tiers (which return to that
// partition only), the PoisonTopic (which may be shared by the partitions:
// each copy names its partition queue) — and a handler per partition
// consumes them (router.Add). The Partitioned Broker's own Endpoints name
// what producers publish to: Topic is the exchange; its Subscriber refuses
// to subscribe (consume the partitions).
type Partitioned interface {
	Broker
	Partitions() []Broker
}

// MeteredBroker is a Broker with instruments of its own, built before
// router.Add sees the stages (rabbitmq.Broker: its confirmed publisher's
// confirm latency and reconnects). router.Add hands it Stages.Env.MeterProvider
// when that is set; the broker records with it only when it was built
// without a provider of its own, and keeps the first one it was handed, so
// one provider on the stages reaches every instrument.
type MeteredBroker interface {
	Broker
	UseMeterProvider(mp metric.MeterProvider) error
}

// Endpoints are what router.Add gives the stages of a handler consuming one
// queue, where the stage's own configuration leaves them unset.
type Endpoints struct {
	// System is messaging.system on spans and metrics ("rabbitmq",
	// "gochannel").
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
	// Consumers is how many competing consumers router.Add starts by
	// default, and MaxConsumers the most the broker allows (0: no limit).
	Consumers, MaxConsumers int
	// Prefetch is the most deliveries each consumer of Subscriber has in
	// flight at once (0: not known). router.Add tells a batch handler how
	// many it can be handed at once, so that a batch closes as soon as
	// every delivery in flight is in it.
	Prefetch int
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
// engaged (rabbitmq.Consumer). router.Add gives it the handler's brake:
// WithGate returns the subscriber the handler consumes from, and closing it
// closes the subscriber.
type GatedSubscriber interface {
	message.Subscriber
	WithGate(g Gate) message.Subscriber
}

// EachPublisher is a publisher that reports each message's outcome: one
// error per message of the call, in order, nil for each one the broker
// holds. The outbox's relay publishes a batch through it, in order and
// pipelined, and keeps exactly the rows whose publish failed; a publisher
// that is not one is called once per message, concurrently.
// rabbitmq.Publisher is one.
type EachPublisher interface {
	PublishEach(topic string, msgs ...*message.Message) []error
}

// PublishChecker is a publisher that can tell, without publishing, that it
// would refuse a message or that its broker could not carry it: a header
// name over 255 bytes, more headers than a consumer's client can read, a
// header the broker interprets (RabbitMQ's CC and BCC), a body over the
// broker's limit. CheckPublish returns an error matching
// sluice.ErrUnpublishable for such a message, nil otherwise; publishing the
// message may still fail for a reason of the moment (an unroutable topic,
// an outage). The outbox checks each message when it is written
// (sluicesql.OutboxConfig.Checker), so a message that can never be
// published fails the transaction it would have been written in, instead
// of waiting in the outbox for ever. rabbitmq.Publisher is one.
type PublishChecker interface {
	CheckPublish(topic string, msg *message.Message) error
}
