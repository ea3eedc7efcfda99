// Package republish holds what the retry-tier and poison stages do alike:
// copy a delivery into a new message and publish it on a context detached
// from the handler's deadline, or back off before the original is nacked.
package republish

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/clock"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Copy returns a new message — a new UUID, msg's payload, a copy of its
// metadata with room for extra more keys — in msg's context. When msg's
// context holds a span (the Trace stage's), the copy carries it as
// sluice.PreviousTraceparentKey; the producer's traceparent stays as is.
//
// It records the origin (metakeys.OriginExchange and
// OriginRoutingKey) from the delivery's source keys when the message
// carries none yet, so every later copy names the producer's exchange and
// routing key rather than the last dead-letter hop.
func Copy(msg *message.Message, extra int) *message.Message {
	c := message.NewMessage(watermill.NewUUID(), msg.Payload)
	c.Metadata = make(message.Metadata, len(msg.Metadata)+extra+3)
	for k, v := range msg.Metadata {
		c.Metadata[k] = v
	}
	if _, ok := c.Metadata[metakeys.OriginRoutingKey]; !ok {
		if rk, ok := msg.Metadata[metakeys.SourceRoutingKey]; ok {
			c.Metadata[metakeys.OriginExchange] = msg.Metadata[metakeys.SourceExchange]
			c.Metadata[metakeys.OriginRoutingKey] = rk
		}
	}
	if tp := telemetry.Traceparent(msg.Context()); tp != "" {
		c.Metadata[sluice.PreviousTraceparentKey] = tp
	}
	c.SetContext(msg.Context())
	return c
}

// Publish publishes c to topic on a context detached from c's (its values
// kept, its deadline and cancellation dropped) and bounded by timeout: a copy
// must not fail because the handler's deadline (Watermill's Timeout
// middleware, a router closing) has passed. When the publish fails it waits
// backoff, likewise detached, so that the caller's nack is not a hot
// redelivery loop, and returns the error.
func Publish(pub message.Publisher, topic string, c *message.Message, timeout, backoff time.Duration) error {
	err := Try(pub, topic, c, timeout)
	if err != nil {
		Backoff(backoff)
	}
	return err
}

// Try publishes c to topic as Publish does, without the backoff: for a
// caller with somewhere else to try.
func Try(pub message.Publisher, topic string, c *message.Message, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context()), timeout)
	defer cancel()
	orig := c.Context()
	c.SetContext(ctx)
	err := pub.Publish(topic, c)
	c.SetContext(orig)
	return err
}

// Backoff waits d (detached from any handler's context) before a nack.
func Backoff(d time.Duration) { clock.Sleep(context.Background(), d) }
