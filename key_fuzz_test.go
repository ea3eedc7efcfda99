package sluice_test

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
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
	f.Add([]byte(`{"eventId":"A","EVENTID":"B"}`))
	f.Add([]byte(`{"EventId":"X"}`))
	f.Add([]byte(`{"Order":{"ID":"X"},"order":{"id":"Y"}}`))
	f.Add([]byte("{\"\u212aey\":\"k\",\"eventId\":\"e\"}"))
	keys := []sluice.KeyFunc{
		sluice.KeyFromJSON("eventId"),
		sluice.KeyFromJSON("order", "id"),
		sluice.KeyPrefix("P:", sluice.KeyFromJSON("eventId")),
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		msg := message.NewMessage("uuid", payload)
		for _, k := range keys {
			key, err := k(msg)
			if err != nil {
				if !errors.As(err, new(*sluice.KeyError)) {
					t.Fatalf("error %v is not a KeyError", err)
				}
				continue
			}
			if key == "" {
				t.Fatal("an empty key without an error")
			}
		}
		// Differentially against encoding/json: a key is exactly what a
		// handler decoding the payload into a struct field tagged with the
		// path reads — case variants of the name included, which it folds
		// onto the field (issue 43) — and is valid UTF-8.
		agrees(t, payload, false)
		agrees(t, payload, true)
		key, err := keys[0](msg)
		if err != nil {
			return
		}
		var obj map[string]any
		if json.Unmarshal(payload, &obj) != nil {
			t.Fatalf("a key %q from a payload that is not a JSON object", key)
		}
		if !utf8.ValidString(key) {
			t.Fatalf("the key %q is not valid UTF-8", key)
		}
	})
}
