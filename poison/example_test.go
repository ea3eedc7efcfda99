package poison_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/poison"
)

// A malformed message is isolated with a diagnosis and the original acked;
// here the poison queue is an in-memory topic that can be read back.
func Example() {
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer func() { _ = pubSub.Close() }()
	isolate, err := poison.New(poison.Config{Publisher: pubSub, Topic: "orders.poison", Queue: "orders"})
	if err != nil {
		panic(err)
	}
	handler := isolate(func(msg *message.Message) ([]*message.Message, error) {
		return nil, sluice.Poison(errors.New(`order.created: missing field "sku"`))
	})

	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-1"}`))
	msg.Metadata.Set(sluice.EventIDKey, "evt-7")
	_, err = handler(msg)
	fmt.Println("handler error (nil: ack):", err)

	out, _ := pubSub.Subscribe(context.Background(), "orders.poison")
	p := <-out
	p.Ack()
	fmt.Println(string(p.Payload))
	// The diagnosis keys are the strings of docs/poison.md's table.
	for _, k := range []string{sluice.EventIDKey, "sluice_poison_class", "sluice_poison_reason", "sluice_poison_queue", sluice.AttemptKey} {
		fmt.Printf("%s: %s\n", k, p.Metadata.Get(k))
	}
	// Output:
	// handler error (nil: ack): <nil>
	// {"orderId":"o-1"}
	// sluice_event_id: evt-7
	// sluice_poison_class: poison
	// sluice_poison_reason: poison: order.created: missing field "sku"
	// sluice_poison_queue: orders
	// sluice_attempt: 1
}
