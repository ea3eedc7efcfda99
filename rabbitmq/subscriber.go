package rabbitmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/diag"
)

// PrefetchDefault is the subscriber's default prefetch count.
const PrefetchDefault = 16

// SubscriberConfig configures NewSubscriber.
type SubscriberConfig struct {
	// URL of the broker. Required.
	URL string
	// Prefetch is how many unacked deliveries the broker sends ahead.
	// Default PrefetchDefault.
	Prefetch int
	// Logger. Default watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// TLS configures an amqps:// URL's TLS.
	TLS *tls.Config
}

// NewSubscriber returns a watermill-amqp subscriber that consumes the queue
// named by the topic given to Subscribe, unmarshals with Marshaler (so
// deliveries carrying x-death or other non-string headers are handled, not
// nacked in a loop), requeues on nack, and declares nothing: declare the
// queues with Topology.Declare first. It reconnects after a broker restart.
// One subscription handles one delivery at a time; subscribe several times
// (or add several router handlers) for concurrency.
func NewSubscriber(cfg SubscriberConfig) (*wamqp.Subscriber, error) {
	if cfg.URL == "" {
		return nil, errors.New("rabbitmq: SubscriberConfig.URL is required")
	}
	if err := checkURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("rabbitmq: SubscriberConfig.URL: %w", err)
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = PrefetchDefault
	}
	if cfg.Prefetch < 0 {
		return nil, fmt.Errorf("rabbitmq: SubscriberConfig.Prefetch must be positive, got %d", cfg.Prefetch)
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	if cfg.TLS != nil && !strings.HasPrefix(cfg.URL, "amqps://") {
		return nil, errors.New("rabbitmq: SubscriberConfig.TLS needs an amqps:// URL")
	}
	c := wamqp.NewDurableQueueConfig(cfg.URL)
	c.Connection.TLSConfig = cfg.TLS
	c.Marshaler = Marshaler{}
	c.Consume.Qos.PrefetchCount = cfg.Prefetch
	c.TopologyBuilder = declaredElsewhere{}
	sub, err := wamqp.NewSubscriber(c, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connecting the subscriber to %s: %w", diag.RedactURL(cfg.URL), diag.RedactError(err))
	}
	return sub, nil
}

// declaredElsewhere is a TopologyBuilder that declares nothing: Topology did.
type declaredElsewhere struct{}

func (declaredElsewhere) BuildTopology(*amqp.Channel, wamqp.BuildTopologyParams, wamqp.Config, watermill.LoggerAdapter) error {
	return nil
}

func (declaredElsewhere) ExchangeDeclare(*amqp.Channel, string, wamqp.Config) error { return nil }
