package rabbitmq_test

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/rabbitmq"
)

// table builds an AMQP header table from fuzz bytes: each entry takes a key
// length, a key, a type and a value, covering every field type amqp091
// decodes (and nesting).
func table(data []byte, depth int) amqp.Table {
	t := amqp.Table{}
	for len(data) > 2 && len(t) < 16 {
		kl := int(data[0]%12) + 1
		data = data[1:]
		if len(data) < kl+1 {
			break
		}
		key, kind := string(data[:kl]), data[kl]
		data = data[kl+1:]
		var v any
		n := min(len(data), 8)
		chunk := data[:n]
		data = data[n:]
		var x int64
		for _, b := range chunk {
			x = x<<8 | int64(b)
		}
		switch kind % 14 {
		case 0:
			v = string(chunk)
		case 1:
			v = x
		case 2:
			v = int32(x)
		case 3:
			v = int16(x)
		case 4:
			v = x%2 == 0
		case 5:
			v = float64(x) / 7
		case 6:
			v = float32(x) / 3
		case 7:
			v = time.Unix(x%1e10, 0)
		case 8:
			v = amqp.Decimal{Scale: uint8(x % 10), Value: int32(x)}
		case 9:
			v = chunk
		case 10:
			v = nil
		case 11:
			if depth < 3 {
				v = table(chunk, depth+1)
			}
		case 12:
			if depth < 3 {
				v = []any{string(chunk), x, table(chunk, depth+1)}
			}
		case 13:
			v = uint8(x)
		}
		t[key] = v
	}
	return t
}

// FuzzMarshalerUnmarshal: any delivery unmarshals, without error; metadata
// holds no broker header; a republish carries no delivery-scoped key; string
// headers survive the round trip.
func FuzzMarshalerUnmarshal(f *testing.F) {
	f.Add([]byte("\x07x-death\x0c12345678"), "orders")
	f.Add([]byte("\x05event\x00evt-1\x03\x05count\x01\x00\x00\x00\x00\x00\x00\x00\x02"), "")
	f.Add([]byte("\x0ex-first-death-queue\x00q.retry.30s"), "q")
	f.Add([]byte("\x0bsluice_amqp_exchange\x00stale"), "x")
	f.Fuzz(func(t *testing.T, data []byte, exchange string) {
		h := table(data, 0)
		msg, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: nopAcker{}, Headers: h, Body: data, Exchange: exchange, RoutingKey: "rk"})
		if err != nil {
			t.Fatalf("Unmarshal failed: %v", err)
		}
		for k, v := range msg.Metadata {
			if strings.HasPrefix(k, "x-") {
				t.Fatalf("broker header %q in the metadata", k)
			}
			if s, ok := h[k].(string); ok && !strings.HasPrefix(k, metakeys.DeliveryPrefix) && k != "_watermill_message_uuid" && s != v {
				t.Fatalf("string header %q changed: %q → %q", k, s, v)
			}
		}
		if msg.Metadata.Get(metakeys.SourceExchange) != exchange {
			t.Fatalf("exchange %q, want %q", msg.Metadata.Get(metakeys.SourceExchange), exchange)
		}
		pub, err := rabbitmq.Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatalf("Marshal failed: %v", err)
		}
		for k, v := range pub.Headers {
			if strings.HasPrefix(k, metakeys.DeliveryPrefix) {
				t.Fatalf("delivery-scoped key %q republished", k)
			}
			if _, ok := v.(string); !ok { // metadata is text: every republished header is a string
				t.Fatalf("republished header %q is %T", k, v)
			}
		}
	})
}
