package rabbitmq

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Marshaler is a watermill-amqp Marshaler that reads any delivery.
//
// watermill-amqp's DefaultMarshaler fails on a header that is not a string,
// and the subscriber then nacks the delivery with requeue in a tight loop
// (watermill#65) — which is what every message coming back from a TTL tier
// looks like, since RabbitMQ adds x-death, an array of tables. Marshaler
// instead:
//   - keeps string headers as metadata, as DefaultMarshaler does;
//   - leaves RabbitMQ's own x- headers out of the metadata, and sets the
//     delivery-scoped keys (ExchangeKey, DeathCountKey, FirstDeathQueueKey,
//     ...) from them and from the delivery;
//   - turns other producers' non-string headers into text: integers and
//     floats in decimal, booleans as true/false, timestamps in RFC 3339,
//     byte arrays as text when they are UTF-8, tables and arrays as JSON. A
//     copy republished from such a message carries them as strings.
//
// Marshal is DefaultMarshaler's (persistent, metadata as headers, the UUID in
// _watermill_message_uuid) without the delivery-scoped keys.
type Marshaler struct {
	wamqp.DefaultMarshaler
}

var _ wamqp.Marshaler = Marshaler{}

// Marshal returns the publishing of msg.
func (m Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	pub, err := m.DefaultMarshaler.Marshal(msg)
	for k := range pub.Headers {
		if isDeliveryScoped(k) || k == PublishIDHeader {
			delete(pub.Headers, k)
		}
	}
	return pub, err
}

// Unmarshal returns the message of d; it fails on no header.
func (m Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	uuidKey := m.MessageUUIDHeaderKey
	if uuidKey == "" {
		uuidKey = wamqp.DefaultMessageUUIDHeaderKey
	}
	uuid, _ := d.Headers[uuidKey].(string)
	msg := message.NewMessage(uuid, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers)+4)
	for k, v := range d.Headers {
		switch {
		case k == uuidKey, k == PublishIDHeader, isDeliveryScoped(k):
		case strings.HasPrefix(k, "x-"):
			brokerHeader(msg.Metadata, k, v)
		default:
			msg.Metadata[k] = headerText(v)
		}
	}
	msg.Metadata[ExchangeKey] = d.Exchange
	msg.Metadata[RoutingKeyKey] = d.RoutingKey
	msg.Metadata[RedeliveredKey] = strconv.FormatBool(d.Redelivered)
	return msg, nil
}

// brokerHeader sets the delivery-scoped keys RabbitMQ's header k holds.
func brokerHeader(md message.Metadata, k string, v any) {
	switch k {
	case "x-delivery-count":
		md[DeliveryCountKey] = headerText(v)
	case "x-first-death-queue":
		md[FirstDeathQueueKey] = headerText(v)
	case "x-first-death-reason":
		md[FirstDeathReasonKey] = headerText(v)
	case "x-first-death-exchange":
		md[FirstDeathExchangeKey] = headerText(v)
	case "x-death":
		deaths, _ := v.([]any)
		var total int64
		for i, d := range deaths {
			t, ok := d.(amqp.Table)
			if !ok {
				continue
			}
			if n, ok := toInt(t["count"]); ok {
				total += n
			}
			if i == 0 { // RabbitMQ puts the most recent death first
				md[LastDeathQueueKey] = headerText(t["queue"])
				md[LastDeathReasonKey] = headerText(t["reason"])
			}
		}
		md[DeathCountKey] = strconv.FormatInt(total, 10)
	}
}

func toInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		return int64(n), true //nolint:gosec // header counts are small
	}
	return 0, false
}

// headerText is the metadata text of an AMQP field value.
func headerText(v any) string {
	if n, ok := toInt(v); ok {
		return strconv.FormatInt(n, 10)
	}
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case amqp.Decimal:
		return decimalText(x)
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
	}
	b, err := json.Marshal(jsonable(v))
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// jsonable converts AMQP tables and arrays, recursively, into values
// encoding/json renders as the text headerText gives their scalars.
func jsonable(v any) any {
	switch x := v.(type) {
	case amqp.Table:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = jsonable(e)
		}
		return m
	case []any:
		a := make([]any, len(x))
		for i, e := range x {
			a[i] = jsonable(e)
		}
		return a
	case time.Time, amqp.Decimal:
		return headerText(x)
	}
	return v
}

func decimalText(d amqp.Decimal) string {
	s := strconv.FormatInt(int64(d.Value), 10)
	if d.Scale == 0 {
		return s
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for len(s) <= int(d.Scale) {
		s = "0" + s
	}
	s = s[:len(s)-int(d.Scale)] + "." + s[len(s)-int(d.Scale):]
	if neg {
		s = "-" + s
	}
	return s
}
