package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/rabbitmq"
)

// ConsumersDefault is how many competing consumers RabbitMQ.Add starts.
const ConsumersDefault = 4

// RabbitMQConfig configures the RabbitMQ side of one consumer queue.
type RabbitMQConfig struct {
	// URL of the broker. Required; its password never appears in errors.
	URL string
	// Topology of the queue: Queue is required.
	Topology rabbitmq.TopologyConfig
	// Prefetch of each consumer. Default rabbitmq.PrefetchDefault.
	Prefetch int
	// Logger. Default watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// MeterProvider of the publisher's confirm latency. Default the global provider.
	MeterProvider metric.MeterProvider
}

// RabbitMQ is one consumer queue on RabbitMQ: its topology declared (main
// queue, retry tiers, poison queue), Sluice's confirmed publisher for the
// tier and poison copies, and a subscriber with Sluice's marshaler.
type RabbitMQ struct {
	topo *rabbitmq.Topology
	pub  *rabbitmq.Publisher
	sub  *wamqp.Subscriber
}

// NewRabbitMQ declares the topology and connects the publisher and the
// subscriber.
func NewRabbitMQ(ctx context.Context, cfg RabbitMQConfig) (*RabbitMQ, error) {
	if cfg.URL == "" {
		return nil, errors.New("router: RabbitMQConfig.URL is required")
	}
	topo, err := rabbitmq.NewTopology(cfg.Topology)
	if err != nil {
		return nil, fmt.Errorf("router: RabbitMQConfig.Topology: %w", err)
	}
	conn, err := amqp.DialConfig(cfg.URL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("router: connecting to %s: %s", diag.RedactURL(cfg.URL), diag.Redact(err.Error()))
	}
	defer func() { _ = conn.Close() }()
	if err := topo.Declare(ctx, conn); err != nil {
		return nil, err
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{URL: cfg.URL, Logger: cfg.Logger, MeterProvider: cfg.MeterProvider})
	if err != nil {
		return nil, err
	}
	sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{URL: cfg.URL, Prefetch: cfg.Prefetch, Logger: cfg.Logger})
	if err != nil {
		_ = pub.Close()
		return nil, err
	}
	return &RabbitMQ{topo: topo, pub: pub, sub: sub}, nil
}

// Topology returns the declared topology.
func (q *RabbitMQ) Topology() *rabbitmq.Topology { return q.topo }

// Publisher returns the confirmed publisher (also usable for the handler's
// own messages).
func (q *RabbitMQ) Publisher() *rabbitmq.Publisher { return q.pub }

// Add adds a reliable handler consuming the queue: Topic and Subscriber are
// the queue's; the Poison and Retry stages, when chosen, get the confirmed
// publisher, the poison queue, the tiers and the queue name where theirs are
// unset; Trace gets System "rabbitmq". Consumers defaults to
// ConsumersDefault: watermill-amqp handles one delivery at a time per
// consumer.
func (q *RabbitMQ) Add(r *message.Router, cfg HandlerConfig) ([]*message.Handler, error) {
	cfg.Topic, cfg.Subscriber = q.topo.Queue(), q.sub
	if cfg.Consumers == 0 {
		cfg.Consumers = ConsumersDefault
	}
	cfg.Stages = cfg.Stages.withBroker(broker{
		copies: q.pub, retryCopies: q.pub, poisonTopic: q.topo.PoisonQueue(),
		queue: q.topo.Queue(), tiers: q.topo.Tiers(), system: "rabbitmq",
	})
	return Add(r, cfg)
}

// Close closes the subscriber and the publisher; close the router first.
func (q *RabbitMQ) Close() error {
	return errors.Join(q.sub.Close(), q.pub.Close())
}
