package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice/broker"
)

// consumersDefault is how many competing consumers router.Add starts on a
// Broker with WatermillSubscriber: watermill-amqp's subscriber handles one
// delivery at a time per consumer. Sluice's Consumer, the default, needs one:
// it keeps Prefetch deliveries in flight.
const consumersDefault = 4

// BrokerConfig configures NewBroker.
type BrokerConfig struct {
	// Connection is the broker's URL and the connection's options, handed
	// whole to the topology's connection, the publisher and the subscriber.
	Connection
	// Topology of the queue: Queue is required.
	Topology TopologyConfig
	// Prefetch of each consumer. Default 16.
	Prefetch int
	// DrainTimeout bounds how long closing waits for the deliveries in
	// flight (ConsumerConfig.DrainTimeout). Default 12 s.
	DrainTimeout time.Duration
	// WatermillSubscriber consumes with watermill-amqp's subscriber (one
	// delivery at a time per consumer, 4 consumers; closing
	// nacks the deliveries in flight; no brake; one node: URLs of more than
	// one are refused; watermill-amqp's dial timeouts) instead of Sluice's
	// Consumer (Prefetch deliveries in flight in one consumer, a draining
	// close, the brake's pause). It reads with the Marshaler, through the
	// frame filter, and declares nothing of its own.
	WatermillSubscriber bool
	// DepthInterval is how often the Broker reads the depth and consumers
	// of its queues (a passive declare of each, on a connection of its
	// own, each bounded by WriteTimeout) for the gauges sluice.queue.messages.ready
	// and sluice.queue.consumers and for Depths: the alerts on depths then
	// need no broker plugin. Default 15 s; negative: never
	// (no connection, no gauges).
	DepthInterval time.Duration
}

// withDefaults validates cfg's Connection and returns a copy with its
// defaults filled; Prefetch and DrainTimeout are the consumer's, defaulted
// by NewConsumer (with WatermillSubscriber, Prefetch by newSubscriber),
// and what watermill-amqp's subscriber cannot do is refused here, before
// NewBroker declares anything.
func (cfg BrokerConfig) withDefaults() (BrokerConfig, error) {
	conn, err := cfg.Connection.withDefaults("BrokerConfig")
	if err != nil {
		return cfg, err
	}
	if cfg.WatermillSubscriber {
		if err := checkWatermillSubscriber(conn, cfg.Prefetch); err != nil {
			return cfg, err
		}
	}
	cfg.Connection = conn
	if cfg.DepthInterval == 0 {
		cfg.DepthInterval = depthIntervalDefault
	}
	return cfg, nil
}

// Broker is one consumer queue on RabbitMQ, as router.Add takes it: its
// topology declared (the queue, its retry tiers, its poison queue), the
// confirmed publisher for the copies, and a subscriber with the Marshaler.
type Broker struct {
	topo      *Topology
	pub       *Publisher
	sub       message.Subscriber
	consumers int
	depth     *depthPoller // nil with a negative DepthInterval
	conn      Connection

	// With TopologyConfig.Partitions: one Broker per partition, and the
	// producers' publisher to the exchange.
	parts    []*Broker
	producer *Publisher
	// partition is a partition's Broker: Close closes only its subscriber.
	partition bool
}

var _ broker.MeteredBroker = (*Broker)(nil)

// NewBroker declares the topology and connects the publisher and the
// subscriber. Close it after the router.
//
// With TopologyConfig.Partitions it declares the partitioned topology
// (TopologyConfig.Partitions says what; without the plugin
// rabbitmq_consistent_hash_exchange the error matches
// ErrConsistentHashPlugin) and the Broker is a broker.Partitioned:
// Partitions gives one Broker per partition queue, each with a subscriber
// of its own; the Broker's own Endpoints have the exchange as Topic and a
// Subscriber that refuses; PartitionPublisher publishes to the exchange.
// Without Partitions, Partitions returns nil.
func NewBroker(ctx context.Context, cfg BrokerConfig) (*Broker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	topo, err := NewTopology(cfg.Topology)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: BrokerConfig.Topology: %w", err)
	}
	conn, _, err := cfg.dial("sluice topology", 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = closeConn(conn, cfg.WriteTimeout) }()
	if _, err := topo.Declare(ctx, conn); err != nil {
		return nil, err
	}
	pub, err := NewPublisher(PublisherConfig{Connection: cfg.Connection})
	if err != nil {
		return nil, err
	}
	b := &Broker{topo: topo, pub: pub, consumers: 1, conn: cfg.Connection}
	if cfg.DepthInterval > 0 {
		if b.depth, err = newDepthPoller(cfg.Connection, topo, cfg.DepthInterval); err != nil {
			_ = pub.Close()
			return nil, err
		}
	}
	newSub := func(*Topology) (message.Subscriber, error) {
		if cfg.WatermillSubscriber {
			return newSubscriber(cfg.Connection, cfg.Prefetch)
		}
		c, err := NewConsumer(ConsumerConfig{Connection: cfg.Connection, Prefetch: cfg.Prefetch, DrainTimeout: cfg.DrainTimeout,
			PoisonQueue: topo.cfg.PoisonQueue, PoisonPublisher: pub})
		if err == nil && b.depth != nil {
			c.consuming = b.depth.wake
		}
		return c, err
	}
	if cfg.WatermillSubscriber {
		b.consumers = consumersDefault
	}
	if len(topo.Partitions()) > 0 {
		err = b.newPartitions(newSub)
	} else {
		b.sub, err = newSub(topo)
	}
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	return b, nil
}

// Endpoints are the queue's: its subscriber, its tiers and poison queue,
// the confirmed publisher for both kinds of copies, System "rabbitmq", and
// one consumer (4 with WatermillSubscriber). With
// Partitions: Topic is the exchange producers publish to, the Subscriber
// refuses to subscribe (consume Partitions), no Tiers.
func (b *Broker) Endpoints() broker.Endpoints {
	topic := b.topo.cfg.Queue
	if len(b.parts) > 0 {
		topic = b.topo.cfg.Exchange
	}
	return broker.Endpoints{
		System: "rabbitmq", Topic: topic, Subscriber: b.sub,
		Tiers: b.topo.Tiers(), RetryPublisher: b.pub,
		PoisonTopic: b.topo.cfg.PoisonQueue, PoisonPublisher: b.pub,
		Consumers: b.consumers, Prefetch: b.prefetch(),
	}
}

// prefetch is how many deliveries each consumer has in flight at once:
// the Consumer's prefetch; one with watermill-amqp's subscriber, whose
// handler gets one delivery at a time; 0 for a partitioned Broker's own
// subscriber, which consumes nothing.
func (b *Broker) prefetch() int {
	switch sub := b.sub.(type) {
	case *Consumer:
		return sub.cfg.Prefetch
	case refusingSubscriber:
		return 0
	default:
		return 1
	}
}

// UseMeterProvider makes the broker's publisher record its
// sluice.publish.confirm.duration and sluice.publish.reconnects, and its depth gauges, with
// mp when BrokerConfig.MeterProvider was unset (router.Add hands it
// Stages.Env.MeterProvider): the first provider handed is kept; nil, or a
// broker with a provider of its own, changes nothing.
func (b *Broker) UseMeterProvider(mp metric.MeterProvider) error {
	err := b.pub.metrics.adopt(mp)
	if b.depth != nil {
		err = errors.Join(err, b.depth.adopt(mp))
	}
	return err
}

// Depths returns what the Broker last read of each of its queues, in the
// order of Topology.Queues: the values of its depth gauges (every
// DepthInterval), for a health or readiness check. Nil with a negative
// DepthInterval.
func (b *Broker) Depths() []QueueDepth {
	if b.depth == nil {
		return nil
	}
	return b.depth.Depths()
}

func (b *Broker) closeDepth() error {
	if b.depth == nil {
		return nil
	}
	return b.depth.close()
}

// Topology returns the declared topology.
func (b *Broker) Topology() *Topology { return b.topo }

// Publisher returns the confirmed publisher (also usable for the handler's
// own messages).
func (b *Broker) Publisher() *Publisher { return b.pub }

// Close closes the subscriber, the publisher and the depth reader; close
// the router first. With Partitions, it closes every partition's
// subscriber and the PartitionPublisher too; a partition's Broker closes
// only its subscriber.
func (b *Broker) Close() error {
	var errs []error
	if b.sub != nil {
		errs = append(errs, b.sub.Close())
	}
	if b.partition {
		return errors.Join(errs...)
	}
	for _, p := range b.parts {
		errs = append(errs, p.sub.Close())
	}
	if b.producer != nil {
		errs = append(errs, b.producer.Close())
	}
	return errors.Join(append(errs, b.pub.Close(), b.closeDepth())...)
}
