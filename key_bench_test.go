package sluice_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
)

// KeyFromJSON runs on every delivery the inbox keys by its payload.
func BenchmarkKeyFromJSON(b *testing.B) {
	payload := []byte(`{"eventId":"evt-0123456789","orderId":"o-42","customer":{"id":"c-7","name":"A. Customer","tier":"gold"},"lines":[{"sku":"s-1","qty":2,"price":"9.99"},{"sku":"s-2","qty":1,"price":"19.99"},{"sku":"s-3","qty":5,"price":"1.25"}],"note":"leave at the door, ring twice","createdAt":"2026-12-05T10:00:00Z"}`)
	key := sluice.KeyFromJSON("eventId")
	msg := message.NewMessage("u", payload)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := key(msg); err != nil {
			b.Fatal(err)
		}
	}
}
