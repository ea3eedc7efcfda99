package retrytiers_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/retrytiers"
)

// Retry tiers on the embedded default: a handler that times out twice is
// parked in the 50ms and then the 100ms tier, and succeeds on attempt 3.
func Example() {
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer func() { _ = pubSub.Close() }()
	tiers, err := broker.Ladder("orders", 50*time.Millisecond, 100*time.Millisecond)
	if err != nil {
		panic(err)
	}
	delayed, err := embedded.NewDelayedPublisher(embedded.DelayedPublisherConfig{
		Target: pubSub, Routes: embedded.Routes("orders", tiers), // in-process, not durable
	})
	if err != nil {
		panic(err)
	}
	defer func() { _ = delayed.Close() }()
	retry, err := retrytiers.New(retrytiers.Config{Publisher: delayed, Tiers: tiers})
	if err != nil {
		panic(err)
	}

	done := make(chan struct{})
	handler := retry(func(msg *message.Message) ([]*message.Message, error) {
		attempt, _ := sluice.Attempt(msg)
		fmt.Printf("attempt %d (tier %q)\n", attempt, msg.Metadata.Get(sluice.RetryTierKey))
		if attempt < 3 {
			return nil, sluice.Transient(errors.New("stock service timed out"))
		}
		close(done)
		return nil, nil
	})

	out, err := pubSub.Subscribe(context.Background(), "orders")
	if err != nil {
		panic(err)
	}
	_ = pubSub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
	for {
		select {
		case msg := <-out:
			if _, err := handler(msg); err != nil {
				msg.Nack()
				continue
			}
			msg.Ack()
		case <-done:
			return
		}
	}
	// Output:
	// attempt 1 (tier "")
	// attempt 2 (tier "50ms")
	// attempt 3 (tier "100ms")
}
