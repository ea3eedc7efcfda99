package main

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// delivery is one publish of the script.
type delivery struct {
	payload string
	note    string
}

func order(eventID, orderID, sku string, qty, failTimes int) string {
	return fmt.Sprintf(`{"eventId":%q,"orderId":%q,"sku":%q,"qty":%d,"failTimes":%d}`, eventID, orderID, sku, qty, failTimes)
}

// script is the scenario: what the producer publishes, in order.
var script = []delivery{
	{order("evt-1", "o-1", "book", 1, 0), "new order"},
	{order("evt-2", "o-2", "book", 2, 0), "new order"},
	{order("evt-1", "o-1", "book", 1, 0), "duplicate delivery of evt-1"},
	{order("evt-3", "o-3", "lamp", 1, 1), "stock service times out once: recovers in tier 1"},
	{order("evt-4", "o-4", "piano", 1, 0), "out of stock: rejected, recorded, event published"},
	{order("evt-5", "o-5", "lamp", 1, 2), "stock service times out twice: recovers in tier 2"},
	{order("evt-2", "o-2", "book", 2, 0), "duplicate delivery of evt-2"},
	{`{"eventId":"evt-6","orderId":`, "malformed JSON: poison"},
	{order("evt-7", "o-404", "book", 1, 0), "an order that must exist does not: invariant"},
	{order("evt-8", "o-6", "book", 1, 0), "new order"},
	{order("evt-4", "o-4", "piano", 1, 0), "duplicate delivery of the rejected evt-4"},
}

// expected is what the scenario must end in; run waits until the stores,
// queues and metrics show it. Each handler gets every delivery: the
// inventory commits 6 events (5 reserved, 1 rejected) and poisons 2; the
// order log commits the 7 well-formed events and poisons the malformed one
// (its eventId cannot be read); each leaves out the 3 duplicate deliveries.
var expected = struct {
	committed, poisoned, rejected, logged, logPoisoned int
	duplicates                                         int64
}{committed: 6, poisoned: 2, rejected: 1, logged: 7, logPoisoned: 1, duplicates: 3}

func scriptMessages() []*message.Message {
	msgs := make([]*message.Message, len(script))
	for i, d := range script {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(d.payload))
		msgs[i].Metadata.Set("sluice_event_type", "order.created")
	}
	return msgs
}
