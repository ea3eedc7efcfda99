package rabbitmq

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Unexported defaults and limits the external tests (package rabbitmq_test)
// check by name.
const (
	DialTimeoutDefault   = dialTimeoutDefault
	DrainTimeoutDefault  = drainTimeoutDefault
	MappedValueMaxLength = mappedValueMaxLength
	HeadersMaxEntries    = headersMaxEntries
	SpringTypeIDHeader   = springTypeIDHeader
)

// MaxQueueLength is maxQueueLength.
func MaxQueueLength(delays []time.Duration, defaultPoison bool) int {
	return maxQueueLength(delays, defaultPoison)
}

// WithReconnectBackoff returns cfg with the Consumer's first reconnection
// wait set to d (1 s otherwise), for the tests that watch reconnections.
func WithReconnectBackoff(cfg ConsumerConfig, d time.Duration) ConsumerConfig {
	cfg.reconnectBackoff = d
	return cfg
}

// WithQueueCallTimeout returns cfg with the Consumer's bound on a
// basic.consume's or basic.cancel's answer set to d (70 s otherwise).
func WithQueueCallTimeout(cfg ConsumerConfig, d time.Duration) ConsumerConfig {
	cfg.queueCallTimeout = d
	return cfg
}

// The sentinels under sluice.ErrUnpublishable, and the closed and
// partitioned states, that the external tests match.
var (
	ErrMessageTooLarge = errMessageTooLarge
	ErrRoutingHeader   = errRoutingHeader
	ErrTooManyHeaders  = errTooManyHeaders
	ErrPublisherClosed = errPublisherClosed
	ErrPartitioned     = errPartitioned
)

// NewWatermillSubscriber is the subscriber of a Broker with
// BrokerConfig.WatermillSubscriber (watermill-amqp's, with the Marshaler,
// declaring nothing), for the tests that run the stages on it: conn is
// checked as NewBroker checks it.
func NewWatermillSubscriber(conn Connection) (message.Subscriber, error) {
	cfg, err := BrokerConfig{Connection: conn, WatermillSubscriber: true}.withDefaults()
	if err != nil {
		return nil, err
	}
	return newSubscriber(cfg.Connection, cfg.Prefetch)
}

// ReadDepthsNow makes b's depth poller read its queues now (as a consumer's
// start does), without waiting.
func ReadDepthsNow(b *Broker) { b.depth.wake() }
