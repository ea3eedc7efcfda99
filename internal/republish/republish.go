// Package republish holds what the retry-tier and poison stages do alike:
// copy a delivery into a new message and publish it, or back off before the
// original is nacked.
package republish

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/internal/clock"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/middleware"
)

// Copy returns a new message — a new UUID, msg's payload, a copy of its
// metadata with room for extra more keys — in msg's context. When msg's
// context holds a span (the Trace stage's), the copy carries it as
// middleware.PreviousTraceparentKey; the producer's traceparent stays as is.
func Copy(msg *message.Message, extra int) *message.Message {
	c := message.NewMessage(watermill.NewUUID(), msg.Payload)
	c.Metadata = make(message.Metadata, len(msg.Metadata)+extra+1)
	for k, v := range msg.Metadata {
		c.Metadata[k] = v
	}
	if tp := telemetry.Traceparent(msg.Context()); tp != "" {
		c.Metadata[middleware.PreviousTraceparentKey] = tp
	}
	c.SetContext(msg.Context())
	return c
}

// Publish publishes c to topic. When that fails it waits backoff, bounded by
// c's context, so that the caller's nack is not a hot redelivery loop, and
// returns the error.
func Publish(pub message.Publisher, topic string, c *message.Message, backoff time.Duration) error {
	err := pub.Publish(topic, c)
	if err != nil {
		clock.Sleep(c.Context(), backoff)
	}
	return err
}
