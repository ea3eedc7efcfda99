package sluice_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
)

func TestKeyFuncs(t *testing.T) {
	t.Parallel()
	msg := func(payload string, md ...string) *message.Message {
		m := message.NewMessage("watermill-uuid", []byte(payload))
		for i := 0; i+1 < len(md); i += 2 {
			m.Metadata.Set(md[i], md[i+1])
		}
		return m
	}
	tests := []struct {
		name    string
		key     sluice.KeyFunc
		msg     *message.Message
		want    string
		wantErr string
	}{
		{"metadata", sluice.KeyFromMetadata("event_id"), msg(``, "event_id", "e-1"), "e-1", ""},
		{"metadata missing", sluice.KeyFromMetadata("event_id"), msg(``), "", `metadata "event_id": missing`},
		{"metadata empty", sluice.KeyFromMetadata("event_id"), msg(``, "event_id", ""), "", `metadata "event_id": empty`},
		{"json string", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"e-1","x":[1,2]}`), "e-1", ""},
		{"json escaped string", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"caf\u00e9"}`), "café", ""},
		{"json surrogate pair", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"\ud83d\ude00/\\\"\n"}`), "\U0001F600/\\\"\n", ""},
		{"json number refused", sluice.KeyFromJSON("eventId"), msg(`{"eventId":1234567}`), "", "not a string (a number id: use KeyFromJSONInteger)"},
		{"json invalid UTF-8", sluice.KeyFromJSON("eventId"), msg("{\"eventId\":\"inv\xffx\"}"), "", "not valid UTF-8"},
		{"json lone high surrogate", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"\ud800"}`), "", "unpaired UTF-16 surrogate"},
		{"json lone low surrogate", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"x\udc00"}`), "", "unpaired UTF-16 surrogate"},
		{"json high surrogate then a letter", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"\ud800\u0041"}`), "", "unpaired UTF-16 surrogate"},
		{"json high surrogate at the end", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"\ud800\u"}`), "", "payload is not a JSON object"},
		{"integer", sluice.KeyFromJSONInteger("eventId"), msg(`{"eventId":12345678901234567890}`), "12345678901234567890", ""},
		{"integer negative", sluice.KeyFromJSONInteger("n"), msg(`{"n":-15}`), "-15", ""},
		{"integer zero", sluice.KeyFromJSONInteger("n"), msg(`{"n":0}`), "0", ""},
		{"integer string refused", sluice.KeyFromJSONInteger("n"), msg(`{"n":"1234567"}`), "", "not an integer"},
		{"integer exponent refused", sluice.KeyFromJSONInteger("n"), msg(`{"n":1e3}`), "", "a fraction or an exponent"},
		{"integer fraction refused", sluice.KeyFromJSONInteger("n"), msg(`{"n":1000.0}`), "", "a fraction or an exponent"},
		{"integer minus zero refused", sluice.KeyFromJSONInteger("n"), msg(`{"n":-0}`), "", "not a canonical integer"},
		{"integer missing", sluice.KeyFromJSONInteger("n"), msg(`{}`), "", "missing"},
		{"json nested", sluice.KeyFromJSON("order", "id"), msg(`{"order":{"id":"o-7"}}`), "o-7", ""},
		{"json nested not object", sluice.KeyFromJSON("order", "id"), msg(`{"order":"o-7"}`), "", `field "order" is not a JSON object`},
		{"json null", sluice.KeyFromJSON("eventId"), msg(`{"eventId":null}`), "", "missing"},
		{"json empty", sluice.KeyFromJSON("eventId"), msg(`{"eventId":""}`), "", "empty"},
		{"json bool", sluice.KeyFromJSON("eventId"), msg(`{"eventId":true}`), "", "not a string"},
		{"json object", sluice.KeyFromJSON("eventId"), msg(`{"eventId":{}}`), "", "not a string"},
		{"json array payload", sluice.KeyFromJSON("eventId"), msg(`[1]`), "", "payload is not a JSON object"},
		{"json empty payload", sluice.KeyFromJSON("eventId"), msg(``), "", "payload is not a JSON object"},
		{"json duplicated field", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"a","eventId":"b"}`), "", `field "eventId" appears 2 times`},
		{"json duplicated field spelled with an escape", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"a","event\u0049d":"b"}`), "", `field "eventId" appears 2 times`},
		{"json duplicated integer", sluice.KeyFromJSONInteger("n"), msg(`{"n":1,"n":2}`), "", `field "n" appears 2 times`},
		{"json duplicated parent", sluice.KeyFromJSON("order", "id"), msg(`{"order":{"id":"a"},"order":{"id":"b"}}`), "", `field "order" appears 2 times`},
		{"json duplicated nested field", sluice.KeyFromJSON("order", "id"), msg(`{"order":{"id":"a","id":"a"}}`), "", `field "order.id" appears 2 times`},
		{"json case variant, alone", sluice.KeyFromJSON("eventId"), msg(`{"EventId":"X"}`), "X", ""},
		{"json case variants", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"A","EVENTID":"B"}`), "", `field "eventId" appears 2 times, counting the names encoding/json matches to it regardless of case ("eventId", "EVENTID")`},
		{"json Kelvin sign folds onto k", sluice.KeyFromJSON("kind"), msg(`{"kind":"a","\u212aind":"b"}`), "", `field "kind" appears 2 times`},
		{"json Kelvin sign, alone", sluice.KeyFromJSON("kind"), msg("{\"\u212aind\":\"b\"}"), "b", ""},
		{"json long s folds onto s", sluice.KeyFromJSON("sku"), msg("{\"sku\":\"a\",\"\u017fku\":\"b\"}"), "", `field "sku" appears 2 times`},
		{"json nested case variant, alone", sluice.KeyFromJSON("order", "id"), msg(`{"Order":{"ID":"X"}}`), "X", ""},
		{"json nested parent case variants", sluice.KeyFromJSON("order", "id"), msg(`{"order":{"id":"a"},"ORDER":{"id":"b"}}`), "", `field "order" appears 2 times`},
		{"json nested field case variants", sluice.KeyFromJSON("order", "id"), msg(`{"order":{"id":"a","Id":"b"}}`), "", `field "order.id" appears 2 times`},
		{"json integer case variants", sluice.KeyFromJSONInteger("n"), msg(`{"n":1,"N":2}`), "", `field "n" appears 2 times`},
		{"json case variant not a fold", sluice.KeyFromJSON("eventId"), msg(`{"eventId":"A","event_id":"B","eventIdx":"C"}`), "A", ""},
		{"json duplicate elsewhere is fine", sluice.KeyFromJSON("order", "id"), msg(`{"x":1,"x":2,"order":{"id":"o-1","n":1,"n":2},"y":{"id":"z"}}`), "o-1", ""},
		{"json no path", sluice.KeyFromJSON(), msg(`{}`), "", "no field named"},
		{"prefix", sluice.KeyPrefix("OrderPlaced:", sluice.KeyFromJSON("orderId")), msg(`{"orderId":"o-1"}`), "OrderPlaced:o-1", ""},
		{"prefix error", sluice.KeyPrefix("OrderPlaced:", sluice.KeyFromJSON("orderId")), msg(`{}`), "", `JSON field "orderId": missing`},
		{"join", sluice.KeyJoin("/", sluice.KeyFromMetadata("type"), sluice.KeyFromJSONInteger("orderId")), msg(`{"orderId":7}`, "type", "OrderPlaced"), "OrderPlaced/7", ""},
		{"join error", sluice.KeyJoin("/", sluice.KeyFromMetadata("type"), sluice.KeyFromJSON("orderId")), msg(`{"orderId":7}`), "", `metadata "type": missing`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.key(tt.msg)
			if tt.wantErr != "" {
				require.ErrorAs(t, err, new(*sluice.KeyError))
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// handlerSees is what a handler decoding payload with encoding/json into a
// struct field tagged with path ("eventId", or "order" then "id") reads:
// the string, and whether decoding succeeded with a non-empty one there.
func handlerSees(payload []byte, nested bool) (string, bool) {
	if nested {
		var v struct {
			Order struct {
				ID string `json:"id"`
			} `json:"order"`
		}
		err := json.Unmarshal(payload, &v)
		return v.Order.ID, err == nil && v.Order.ID != ""
	}
	var v struct {
		EventID string `json:"eventId"`
	}
	err := json.Unmarshal(payload, &v)
	return v.EventID, err == nil && v.EventID != ""
}

// agrees fails t unless KeyFromJSON's answer for payload is what a handler
// decoding it with encoding/json reads: a key is exactly the handler's
// string; a refusal of a payload in which the handler reads one is never
// "missing" (the field is there: ambiguous, or not exactly the producer's).
func agrees(t testing.TB, payload []byte, nested bool) {
	t.Helper()
	k := sluice.KeyFromJSON("eventId")
	if nested {
		k = sluice.KeyFromJSON("order", "id")
	}
	key, err := k(message.NewMessage("uuid", payload))
	seen, ok := handlerSees(payload, nested)
	var ke *sluice.KeyError
	switch {
	case err == nil && (!ok || seen != key):
		t.Fatalf("%q: the inbox keys %q, a handler decoding it reads %q (decoded: %t)", payload, key, seen, ok)
	case err != nil && !errors.As(err, &ke):
		t.Fatalf("%q: %v is not a KeyError", payload, err)
	case err != nil && ok && ke.Reason == "missing":
		t.Fatalf("%q: the inbox says missing, a handler decoding it reads %q", payload, seen)
	}
}

// Issue 43, item 2: KeyFromJSON against encoding/json on case-variant
// names. Before, {"eventId":"A","EVENTID":"B"} keyed "A" while a handler
// decoding into struct{EventID string `json:"eventId"`} read "B", and
// {"EventId":"X"} was "missing" while the handler read "X".
func TestKeyFromJSONAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		payload string
		nested  bool
	}{
		{`{"eventId":"A","EVENTID":"B"}`, false},
		{`{"EVENTID":"B","eventId":"A"}`, false},
		{`{"EventId":"X"}`, false},
		{`{"eventid":"X"}`, false},
		{`{"eventId":"A1","EVENTID":"X"}`, false},
		{`{"eventId":"A","EventID":null}`, false},
		{`{"eventId":null,"EventID":"B"}`, false},
		{"{\"event\u0130d\":\"X\"}", false}, // İ (U+0130) is no simple fold of i
		{`{"eventId":"A","event\u0069D":"B"}`, false},
		{`{"eventId":"A","x":{"EVENTID":"B"}}`, false},
		{`{"Order":{"Id":"X"}}`, true},
		{`{"order":{"id":"a"},"ORDER":{"id":"b"}}`, true},
		{`{"order":{"id":"a"},"ORDER":{"x":"b"}}`, true},
		{`{"order":{"id":"a","ID":"b"}}`, true},
		{"{\"order\":{\"id\":\"a\"},\"\u212aey\":1}", true},
	} {
		agrees(t, []byte(c.payload), c.nested)
	}
}
