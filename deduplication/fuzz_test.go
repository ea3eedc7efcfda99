package deduplication_test

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/deduplication"
)

// FuzzKeyFromJSON: any payload gives a non-empty key or a *KeyError, never a
// panic; a key is valid UTF-8 and exactly what encoding/json decodes (which
// is exact for such input: it substitutes U+FFFD only for what KeyFromJSON
// refuses), so two different ids never share a key.
func FuzzKeyFromJSON(f *testing.F) {
	f.Add([]byte(`{"eventId":"evt-1"}`))
	f.Add([]byte(`{"eventId":12.5e3}`))
	f.Add([]byte(`{"order":{"id":"o-1"}}`))
	f.Add([]byte(`{"eventId":`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"eventId":"\u0000"}`))
	f.Add([]byte(`{"eventId":"\ud83d\ude00"}`))
	f.Add([]byte(`{"eventId":"\ud800\udbff"}`))
	f.Add([]byte("{\"eventId\":\"inv\xfex\"}"))
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
		key, err := keys[0](msg)
		if err != nil {
			return
		}
		var obj map[string]any
		if json.Unmarshal(payload, &obj) != nil {
			t.Fatalf("a key %q from a payload that is not a JSON object", key)
		}
		if s, ok := obj["eventId"].(string); !ok || s != key || !utf8.ValidString(key) {
			t.Fatalf("eventId %q gave the key %q: not exactly the producer's string", obj["eventId"], key)
		}
	})
}
