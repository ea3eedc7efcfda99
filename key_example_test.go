package sluice_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
)

// A key composed of a constant and a payload field: one reservation per
// order, whatever event carried it.
func ExampleKeyPrefix() {
	key := sluice.KeyPrefix("OrderPlaced:", sluice.KeyFromJSON("order", "id"))
	k, err := key(message.NewMessage(watermill.NewUUID(), []byte(`{"order":{"id":"o-42"}}`)))
	fmt.Println(k, err)
	// Output: OrderPlaced:o-42 <nil>
}
