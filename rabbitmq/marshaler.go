package rabbitmq

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/metakeys"
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
//     delivery-scoped keys (sluice_amqp_exchange, sluice_amqp_death_count,
//     sluice_amqp_first_death_queue, ...) from them and from the delivery;
//   - turns other producers' non-string headers into text: integers and
//     floats in decimal, booleans as true/false, timestamps in RFC 3339,
//     byte arrays as text when they are UTF-8, tables and arrays as JSON. A
//     copy republished from such a message carries them as strings;
//   - exposes the AMQP properties (content type and encoding, correlation
//     and message id, type, app id, timestamp, priority, reply-to, user id)
//     as the property keys (sluice_property_content_type, ...), which
//     Marshal restores as properties. Only the properties set them: a
//     header named like a property key (sluice_property_*) is a producer's
//     forgery and is dropped, so it can neither pose as a property nor make
//     every copy unpublishable;
//   - sets sluice_amqp_headers_error, with no header, on a delivery whose
//     headers table Sluice's frame filter replaced because the AMQP client
//     would refuse to read it (the Consumer isolates it);
//   - refuses a delivery without an acknowledger (ErrNoDelivery): amqp091
//     hands out zero deliveries once the server cancels a consumer, and
//     those are never messages.
//
// Marshal publishes persistently, the metadata as headers and the UUID in
// _watermill_message_uuid (as DefaultMarshaler), without the
// delivery-scoped keys, with the property keys as properties
// (sluice_property_user_id as the header sluice_origin_user_id: RabbitMQ
// refuses a foreign user_id). What AMQP cannot carry — a header name or a
// short-string property over 255 bytes, a priority or timestamp that does
// not parse, a property key it has no property for — is a
// *sluice.UnpublishableError naming the key (matching
// sluice.ErrUnpublishable), never cut short. The keys are the strings of
// docs/rabbitmq.md's tables ("The marshaler", "AMQP properties").
//
// Unmarshal also maps a foreign producer's properties and headers to the
// metadata Sluice and Watermill read, when the message has none of its own
// (Map; the zero Mapping gives the defaults): the event type
// (sluice.EventTypeKey) from Spring's __TypeId__ header, else the type
// property; Watermill's correlation id (middleware.CorrelationIDMetadataKey)
// from the correlation_id property. The event id is mapped only on request
// (Mapping.EventID).
//
// A Marshaler is safe for concurrent use when its fields are not changed.
type Marshaler struct {
	wamqp.DefaultMarshaler
	// Map says which properties and headers Unmarshal maps to the event
	// type, the correlation id and the event id. The zero Mapping gives
	// the defaults; see Mapping for how to turn a mapping off.
	Map Mapping
}

var _ wamqp.Marshaler = Marshaler{}

// shortStringMaxLength is the longest AMQP short string, in bytes: the limit
// of queue, exchange and header names, routing keys and most properties —
// broker.NameMaxLength, the limit Sluice holds every name to.
const shortStringMaxLength = broker.NameMaxLength

var (
	// ErrNoDelivery is returned by Unmarshal for a delivery without an
	// acknowledger: the zero delivery amqp091 hands out on a closed
	// deliveries channel.
	ErrNoDelivery = errors.New("rabbitmq: not a delivery (no acknowledger): the consumer was cancelled or its channel closed")
)

// Marshal returns the publishing of msg.
func (m Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	pub := amqp.Publishing{Body: msg.Payload, Headers: make(amqp.Table, len(msg.Metadata)+2)}
	if !m.NotPersistentDeliveryMode {
		pub.DeliveryMode = amqp.Persistent
	}
	for k, v := range msg.Metadata {
		switch {
		case isDeliveryScoped(k), k == publishIDHeader:
			continue
		case k == metakeys.PropertyUserID:
			// RabbitMQ refuses a publish whose user_id is not the publishing
			// connection's user: the producer's travels in OriginUserID
			// (which Unmarshal sets beside PropertyUserID; recorded here
			// for a message built by hand).
			if _, ok := msg.Metadata[metakeys.OriginUserID]; !ok && v != "" {
				pub.Headers[metakeys.OriginUserID] = v
			}
			continue
		case strings.HasPrefix(k, metakeys.PropertyPrefix):
			if err := setProperty(&pub, k, v); err != nil {
				return amqp.Publishing{}, &sluice.UnpublishableError{Key: k, Err: err}
			}
			continue
		}
		if len(k) > shortStringMaxLength {
			return amqp.Publishing{}, &sluice.UnpublishableError{Key: k,
				Err: fmt.Errorf("%w: a header name of %d bytes", broker.ErrNameTooLong, len(k))}
		}
		pub.Headers[k] = v
	}
	pub.Headers[m.uuidKey()] = msg.UUID
	if m.PostprocessPublishing != nil {
		pub = m.PostprocessPublishing(pub)
	}
	return pub, nil
}

// StampTimestamp sets a publishing's AMQP timestamp to the time of the
// publish when it has none (its message carried no
// sluice_property_timestamp). Set it as the Marshaler's
// PostprocessPublishing, and RabbitMQ reports how long a classic queue's
// head message has waited (head_message_timestamp, shown by `sluice queues
// --management-url`):
//
//	rabbitmq.Marshaler{DefaultMarshaler: wamqp.DefaultMarshaler{PostprocessPublishing: rabbitmq.StampTimestamp}}
//
// A timestamp the producer set is kept; copies of such a message (retry
// tiers, poison queue, replays) keep it too, so a head's age is the time
// since the event was first published.
func StampTimestamp(p amqp.Publishing) amqp.Publishing {
	if p.Timestamp.IsZero() {
		p.Timestamp = time.Now().UTC().Truncate(time.Second)
	}
	return p
}

// setProperty sets the AMQP property of property key k to v. Its error
// states the rule v breaks, never v: it ends up in diagnoses.
func setProperty(pub *amqp.Publishing, k, v string) error {
	short := func(dst *string) error {
		if len(v) > shortStringMaxLength {
			return fmt.Errorf("%w: a value of %d bytes", broker.ErrNameTooLong, len(v))
		}
		*dst = v
		return nil
	}
	switch k {
	case metakeys.PropertyContentType:
		return short(&pub.ContentType)
	case metakeys.PropertyContentEncoding:
		return short(&pub.ContentEncoding)
	case metakeys.PropertyCorrelationID:
		return short(&pub.CorrelationId)
	case metakeys.PropertyMessageID:
		return short(&pub.MessageId)
	case metakeys.PropertyType:
		return short(&pub.Type)
	case metakeys.PropertyAppID:
		return short(&pub.AppId)
	case metakeys.PropertyReplyTo:
		return short(&pub.ReplyTo)
	case metakeys.PropertyTimestamp:
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return errors.New("want an RFC 3339 time")
		}
		pub.Timestamp = t
	case metakeys.PropertyPriority:
		p, err := strconv.ParseUint(v, 10, 8)
		if err != nil {
			return errors.New("want 0-255 in decimal")
		}
		pub.Priority = uint8(p)
	default:
		return errors.New("not an AMQP property Sluice carries")
	}
	return nil
}

func (m Marshaler) uuidKey() string {
	if m.MessageUUIDHeaderKey == "" {
		return wamqp.DefaultMessageUUIDHeaderKey
	}
	return m.MessageUUIDHeaderKey
}

// Unmarshal returns the message of d — a delivery of a Subscriber, or one
// read from a channel of Dial's connection. A delivery without an
// acknowledger gives ErrNoDelivery. The UUID is the _watermill_message_uuid
// header, else the message_id property, else a new one. The Map's keys the
// message does not carry are set from their sources.
// sluice_amqp_headers_error is set when Sluice's frame filter replaced d's
// headers table (the connections of Dial, NewBroker — BrokerConfig.WatermillSubscriber's
// too — and WithMarshaler read through it). docs/rabbitmq.md's tables list every key
// it sets.
func (m Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	if d.Acknowledger == nil {
		return nil, ErrNoDelivery
	}
	uuidKey := m.uuidKey()
	uuid, _ := d.Headers[uuidKey].(string)
	if uuid == "" {
		uuid = cmp.Or(d.MessageId, watermill.NewUUID())
	}
	msg := message.NewMessage(uuid, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers)+4)
	for k, v := range d.Headers {
		switch {
		case k == uuidKey, k == publishIDHeader, isDeliveryScoped(k):
		case strings.HasPrefix(k, metakeys.PropertyPrefix):
			// Only Sluice writes its property keys, from the delivery's
			// own properties (below): a header of that name is a
			// producer's, and a copy Sluice wrote carries its properties
			// as properties. Dropped, so it can neither pose as a property
			// nor make every copy of the message unpublishable.
		case strings.HasPrefix(k, "x-"):
			brokerHeader(msg.Metadata, k, v)
		default:
			msg.Metadata[k] = headerText(v)
		}
	}
	properties(msg.Metadata, d)
	m.Map.apply(msg.Metadata, d)
	if d.UserId != "" { // the producer's own publish: its validated user, whatever a header says
		msg.Metadata[metakeys.OriginUserID] = d.UserId
	}
	msg.Metadata[metakeys.SourceExchange] = d.Exchange
	msg.Metadata[metakeys.SourceRoutingKey] = d.RoutingKey
	msg.Metadata[metakeys.Redelivered] = strconv.FormatBool(d.Redelivered)
	if reason, ok := headersReason(d.Headers); ok {
		msg.Metadata[metakeys.HeadersError] = reason
	}
	return msg, nil
}

// properties sets the property keys of d's properties that are set.
func properties(md message.Metadata, d amqp.Delivery) {
	for _, p := range [...]struct{ k, v string }{
		{metakeys.PropertyContentType, d.ContentType}, {metakeys.PropertyContentEncoding, d.ContentEncoding},
		{metakeys.PropertyCorrelationID, d.CorrelationId}, {metakeys.PropertyMessageID, d.MessageId}, {metakeys.PropertyType, d.Type},
		{metakeys.PropertyAppID, d.AppId}, {metakeys.PropertyReplyTo, d.ReplyTo}, {metakeys.PropertyUserID, d.UserId},
	} {
		if p.v != "" {
			md[p.k] = p.v
		}
	}
	if !d.Timestamp.IsZero() {
		md[metakeys.PropertyTimestamp] = d.Timestamp.UTC().Format(time.RFC3339)
	}
	if d.Priority != 0 {
		md[metakeys.PropertyPriority] = strconv.Itoa(int(d.Priority))
	}
}

// brokerHeader sets the delivery-scoped keys RabbitMQ's header k holds.
func brokerHeader(md message.Metadata, k string, v any) {
	switch k {
	case "x-delivery-count":
		md[metakeys.DeliveryCount] = headerText(v)
	case "x-first-death-queue":
		md[metakeys.FirstDeathQueue] = headerText(v)
	case "x-first-death-reason":
		md[metakeys.FirstDeathReason] = headerText(v)
	case "x-first-death-exchange":
		md[metakeys.FirstDeathExchange] = headerText(v)
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
				md[metakeys.DeadLetterQueue] = headerText(t["queue"])
				md[metakeys.DeadLetterReason] = headerText(t["reason"])
			}
		}
		md[metakeys.DeathCount] = strconv.FormatInt(total, 10)
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
