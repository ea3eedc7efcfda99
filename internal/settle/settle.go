// Package settle carries, in a delivery's context, the moment its
// subscriber has sent the delivery's ack or nack to the broker: Sluice's
// RabbitMQ Consumer sets it, and ordering.Serialize waits for it before it
// gives back a key's next delivery, so that the broker gets a key's
// returns in their order.
package settle

import "context"

type sentKey struct{}

// WithSent returns ctx carrying sent, which the subscriber closes once it
// has sent the delivery's ack or nack (or will send nothing more: its
// channel is gone, and the broker returns the delivery itself).
func WithSent(ctx context.Context, sent <-chan struct{}) context.Context {
	return context.WithValue(ctx, sentKey{}, sent)
}

// Sent returns the channel WithSent put in ctx; nil when the subscriber
// gave none.
func Sent(ctx context.Context) <-chan struct{} {
	sent, _ := ctx.Value(sentKey{}).(<-chan struct{})
	return sent
}
