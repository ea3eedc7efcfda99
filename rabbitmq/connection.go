package rabbitmq

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice/internal/diag"
)

// Connection's defaults.
const (
	dialTimeoutDefault = 10 * time.Second
	// writeTimeoutDefault bounds each write to the broker's socket. A broker
	// that stops reading (a connection blocked by a memory or disk alarm)
	// then fails the write instead of holding every publisher.
	writeTimeoutDefault = 10 * time.Second
)

// Connection is how to reach the broker, the options every connection
// shares. PublisherConfig, ConsumerConfig and BrokerConfig embed it, and
// Dial takes it; NewBroker hands its own to the topology's connection, the
// publisher and the subscriber it makes.
type Connection struct {
	// URL of the broker, amqp:// or amqps://. Required unless URLs is set;
	// its password never appears in errors or logs.
	URL string
	// URLs are the nodes of a cluster, amqp:// or amqps://, each checked as
	// URL is: set URL or URLs, not both. Every connection — the
	// Publisher's, each Consumer subscription's, the topology's — tries
	// them in turn, each bounded by DialTimeout, and connects to the first
	// that answers. A connection that fails makes its Publisher or
	// subscription reconnect to the node after the one it had, so the
	// nodes are tried in this order and a dead node is tried last: list
	// them in a different order in each process to spread the
	// connections. BrokerConfig.WatermillSubscriber (watermill-amqp's
	// subscriber) refuses more than one.
	URLs []string
	// TLS configures the TLS of an amqps:// URL (root CAs, client
	// certificate, server name). Default: the system's roots. Refused with
	// an amqp:// URL, which would not use it.
	TLS *tls.Config
	// DialTimeout bounds connecting and the AMQP handshake. Default 10 s.
	// BrokerConfig.WatermillSubscriber's connections keep watermill-amqp's.
	DialTimeout time.Duration
	// WriteTimeout bounds each write to the socket, so a broker that stops
	// reading cannot hold a publish past it; the wait for the broker's
	// answer when a connection closes (a Consumer's drain: after
	// DrainTimeout); and the wait for its answer to a channel's opening,
	// the Publisher's confirm mode and the Consumer's prefetch (its
	// consume and cancel wait up to 70 s: a quorum queue's Raft command),
	// so a broker whose heartbeats keep the connection alive while its
	// channels answer nothing has the connection closed after it, and a new
	// one opened. Default 10 s. BrokerConfig.WatermillSubscriber's
	// connections (watermill-amqp's) have none.
	WriteTimeout time.Duration
	// MaxMessageSize is the broker's max_message_size, in bytes: the
	// Publisher refuses a larger body before sending it (a
	// *sluice.UnpublishableError), since RabbitMQ would close the channel
	// and fail every publish in flight on it; Publisher.CheckPublish
	// refuses it when the outbox writes it. Set it to the broker's own:
	// 16 MiB on RabbitMQ 4.x unless changed. Default 128 MiB, RabbitMQ
	// 3.x's, the largest default a broker has: 4.x's 16 MiB would refuse,
	// on a 3.x broker, the tier and poison copies of larger messages it
	// delivered.
	MaxMessageSize int
	// Logger reports reconnects and deliveries that cannot be read. Default
	// watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// MeterProvider receives the Publisher's sluice.publish.confirm.duration and
	// sluice.publish.reconnects. The Consumer and the Subscriber record nothing of
	// their own: the Consumer's isolation publishes through its
	// PoisonPublisher, which records with its own. Default: for a Broker,
	// the router.Stages.Env.MeterProvider router.Add hands it
	// (Broker.UseMeterProvider), else the global provider.
	MeterProvider metric.MeterProvider
}

// withDefaults validates c and returns a copy with its defaults filled and
// its nodes in URLs (URL empty); its errors name the field as
// config.<Field>.
func (c Connection) withDefaults(config string) (Connection, error) {
	switch {
	case c.URL != "" && len(c.URLs) > 0:
		return c, fmt.Errorf("rabbitmq: %s.URL and %s.URLs are both set: set URL for one node, URLs for a cluster's nodes", config, config)
	case c.URL == "" && len(c.URLs) == 0:
		return c, fmt.Errorf("rabbitmq: %s.URL is required", config)
	case c.DialTimeout < 0:
		return c, fmt.Errorf("rabbitmq: %s.DialTimeout must not be negative, got %s", config, c.DialTimeout)
	case c.WriteTimeout < 0:
		return c, fmt.Errorf("rabbitmq: %s.WriteTimeout must not be negative, got %s", config, c.WriteTimeout)
	case c.MaxMessageSize < 0:
		return c, fmt.Errorf("rabbitmq: %s.MaxMessageSize must not be negative, got %d", config, c.MaxMessageSize)
	}
	urls := c.URLs
	if c.URL != "" {
		urls = []string{c.URL}
	}
	seen := make(map[string]bool, len(urls))
	for i, u := range urls {
		name := config + ".URL"
		if c.URL == "" {
			name = fmt.Sprintf("%s.URLs[%d]", config, i)
		}
		switch {
		case u == "":
			return c, fmt.Errorf("rabbitmq: %s is empty", name)
		case c.TLS != nil && !strings.HasPrefix(u, "amqps://"):
			return c, fmt.Errorf("rabbitmq: %s.TLS needs an amqps:// URL, %s is %s", config, name, diag.RedactURL(u))
		case seen[u]:
			return c, fmt.Errorf("rabbitmq: %s %s is listed twice", name, diag.RedactURL(u))
		}
		seen[u] = true
		if _, err := amqp.ParseURI(u); err != nil {
			return c, fmt.Errorf("rabbitmq: %s %s is not an AMQP URI: %w", name, diag.RedactURL(u), diag.RedactError(err))
		}
	}
	return Connection{
		URLs:           slices.Clone(urls),
		TLS:            c.TLS,
		DialTimeout:    cmp.Or(c.DialTimeout, dialTimeoutDefault),
		WriteTimeout:   cmp.Or(c.WriteTimeout, writeTimeoutDefault),
		MaxMessageSize: cmp.Or(c.MaxMessageSize, maxMessageSizeDefault),
		Logger:         cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{}),
		MeterProvider:  c.MeterProvider,
	}, nil
}
