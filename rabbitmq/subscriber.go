package rabbitmq

import (
	"cmp"
	"fmt"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"

	"github.com/sluicemq/sluice/internal/diag"
)

// prefetchDefault is the default prefetch of BrokerConfig, ConsumerConfig
// and SubscriberConfig: with Sluice's Consumer, how many deliveries one
// subscription hands to the router's handlers at once — the connections a
// database pool the handlers share needs, beside its other users.
const prefetchDefault = 16

// SubscriberConfig configures NewSubscriber.
type SubscriberConfig struct {
	// Connection is the broker's URL and the connection's options.
	// watermill-amqp dials with its own timeouts (not DialTimeout nor
	// WriteTimeout), connects to one node (URLs of more than one are
	// refused), and the subscriber records no metrics.
	Connection
	// Prefetch is how many unacked deliveries the broker sends ahead.
	// Default 16.
	Prefetch int
}

// withDefaults validates cfg and returns a copy with its defaults filled.
func (cfg SubscriberConfig) withDefaults() (SubscriberConfig, error) {
	conn, err := cfg.Connection.withDefaults("SubscriberConfig")
	if err != nil {
		return cfg, err
	}
	if len(conn.URLs) > 1 {
		return cfg, fmt.Errorf("rabbitmq: SubscriberConfig.URLs has %d nodes: watermill-amqp's subscriber connects to one; NewConsumer moves between several", len(conn.URLs))
	}
	if cfg.Prefetch < 0 {
		return cfg, fmt.Errorf("rabbitmq: SubscriberConfig.Prefetch must be positive, got %d", cfg.Prefetch)
	}
	return SubscriberConfig{Connection: conn, Prefetch: cmp.Or(cfg.Prefetch, prefetchDefault)}, nil
}

// NewSubscriber returns a watermill-amqp subscriber that consumes the queue
// named by the topic given to Subscribe, unmarshals with Marshaler (so
// deliveries carrying x-death or other non-string headers are handled, not
// nacked in a loop), requeues on nack, and declares nothing: declare the
// queues with Topology.Declare first. Subscribe on a queue that does not
// exist fails, matching ErrQueueNotFound and naming the queue. To keep a
// watermill-amqp Config of your own (its declarations, its settings) and
// read with the Marshaler, use WithMarshaler and watermill-amqp's
// NewSubscriber instead. It reconnects after a broker restart.
// One subscription handles one delivery at a time: with router.Add, set
// HandlerConfig.Consumers for concurrency (BrokerConfig.WatermillSubscriber
// defaults it to 4).
func NewSubscriber(cfg SubscriberConfig) (*wamqp.Subscriber, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	url := cfg.URLs[0]
	c := wamqp.NewDurableQueueConfig(url)
	c.Connection.TLSConfig = cfg.TLS
	c.Marshaler = Marshaler{}
	c.Consume.Qos.PrefetchCount = cfg.Prefetch
	c.TopologyBuilder = declaredElsewhere{}
	if c, err = filtered(c); err != nil {
		return nil, err
	}
	sub, err := wamqp.NewSubscriber(c, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connecting the subscriber to %s: %w", diag.RedactURL(url), diag.RedactError(err))
	}
	return sub, nil
}
