package deduplication_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/deduplication"
)

// FuzzKeyFromJSON: any payload gives a non-empty key or a *KeyError, never a
// panic; a JSON object with a non-empty string eventId gives exactly it.
func FuzzKeyFromJSON(f *testing.F) {
	f.Add([]byte(`{"eventId":"evt-1"}`))
	f.Add([]byte(`{"eventId":12.5e3}`))
	f.Add([]byte(`{"order":{"id":"o-1"}}`))
	f.Add([]byte(`{"eventId":`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"eventId":"\u0000"}`))
	keys := []deduplication.KeyFunc{
		deduplication.KeyFromJSON("eventId"),
		deduplication.KeyFromJSON("order", "id"),
		deduplication.KeyPrefix("P:", deduplication.KeyFromJSON("eventId")),
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		msg := message.NewMessage("uuid", payload)
		for _, k := range keys {
			key, err := k(msg)
			if err != nil {
				if !errors.Is(err, deduplication.ErrInvalidKey) {
					t.Fatalf("error %v is not a KeyError", err)
				}
				continue
			}
			if key == "" {
				t.Fatal("an empty key without an error")
			}
		}
		var obj map[string]any
		if json.Unmarshal(payload, &obj) == nil {
			if s, ok := obj["eventId"].(string); ok && s != "" {
				if key, err := keys[0](msg); err != nil || key != s {
					t.Fatalf("eventId %q gave %q, %v", s, key, err)
				}
			}
		}
	})
}
