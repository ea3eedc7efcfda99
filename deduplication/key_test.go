package deduplication_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/deduplication"
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
		key     deduplication.KeyFunc
		msg     *message.Message
		want    string
		wantErr string
	}{
		{"metadata", deduplication.KeyFromMetadata("event_id"), msg(``, "event_id", "e-1"), "e-1", ""},
		{"metadata missing", deduplication.KeyFromMetadata("event_id"), msg(``), "", `metadata "event_id": missing`},
		{"metadata empty", deduplication.KeyFromMetadata("event_id"), msg(``, "event_id", ""), "", `metadata "event_id": empty`},
		{"json string", deduplication.KeyFromJSON("eventId"), msg(`{"eventId":"e-1","x":[1,2]}`), "e-1", ""},
		{"json escaped string", deduplication.KeyFromJSON("eventId"), msg(`{"eventId":"caf\u00e9"}`), "café", ""},
		{"json number", deduplication.KeyFromJSON("eventId"), msg(`{"eventId":12345678901234567890}`), "12345678901234567890", ""},
		{"json negative number", deduplication.KeyFromJSON("n"), msg(`{"n":-1.5e3}`), "-1.5e3", ""},
		{"json nested", deduplication.KeyFromJSON("order", "id"), msg(`{"order":{"id":"o-7"}}`), "o-7", ""},
		{"json nested not object", deduplication.KeyFromJSON("order", "id"), msg(`{"order":"o-7"}`), "", `field "order" is not a JSON object`},
		{"json null", deduplication.KeyFromJSON("eventId"), msg(`{"eventId":null}`), "", "missing"},
		{"json empty", deduplication.KeyFromJSON("eventId"), msg(`{"eventId":""}`), "", "empty"},
		{"json bool", deduplication.KeyFromJSON("eventId"), msg(`{"eventId":true}`), "", "not a string or number"},
		{"json object", deduplication.KeyFromJSON("eventId"), msg(`{"eventId":{}}`), "", "not a string or number"},
		{"json array payload", deduplication.KeyFromJSON("eventId"), msg(`[1]`), "", "payload is not a JSON object"},
		{"json empty payload", deduplication.KeyFromJSON("eventId"), msg(``), "", "payload is not a JSON object"},
		{"json no path", deduplication.KeyFromJSON(), msg(`{}`), "", "no field named"},
		{"prefix", deduplication.KeyPrefix("OrderPlaced:", deduplication.KeyFromJSON("orderId")), msg(`{"orderId":"o-1"}`), "OrderPlaced:o-1", ""},
		{"prefix error", deduplication.KeyPrefix("OrderPlaced:", deduplication.KeyFromJSON("orderId")), msg(`{}`), "", `JSON field "orderId": missing`},
		{"join", deduplication.KeyJoin("/", deduplication.KeyFromMetadata("type"), deduplication.KeyFromJSON("orderId")), msg(`{"orderId":7}`, "type", "OrderPlaced"), "OrderPlaced/7", ""},
		{"join error", deduplication.KeyJoin("/", deduplication.KeyFromMetadata("type"), deduplication.KeyFromJSON("orderId")), msg(`{"orderId":7}`), "", `metadata "type": missing`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.key(tt.msg)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, deduplication.ErrInvalidKey)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
