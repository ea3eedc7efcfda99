package rabbitmq

import (
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
)

// springTypeIDHeader is the header in which Spring AMQP's Jackson message
// converter names the payload's type (a class name, or the id its type
// mapper gives it).
const springTypeIDHeader = "__TypeId__"

// mappedValueMaxLength is the longest value, in bytes, Unmarshal maps from a
// property or header (AMQP's short string: every property fits).
const mappedValueMaxLength = shortStringMaxLength

// Source is where Unmarshal takes a mapped value from: one of a delivery's
// AMQP properties (PropertyType, PropertyCorrelationID, PropertyMessageID,
// PropertyAppID) or one of its headers (Header). The zero Source is none.
type Source struct {
	property string
	header   string
}

// The AMQP properties a Mapping can read.
var (
	PropertyType          = Source{property: "type"}
	PropertyCorrelationID = Source{property: "correlation_id"}
	PropertyMessageID     = Source{property: "message_id"}
	PropertyAppID         = Source{property: "app_id"}
)

// Header is the Source of the delivery's header name. Only a string (or
// UTF-8 bytes) value is mapped.
func Header(name string) Source { return Source{header: name} }

// String is "property type" or "header __TypeId__".
func (s Source) String() string {
	switch {
	case s.property != "":
		return "property " + s.property
	case s.header != "":
		return "header " + s.header
	}
	return "none"
}

// value is the source's value in d, if it has one Unmarshal may map.
func (s Source) value(d amqp.Delivery) (string, bool) {
	var v string
	switch {
	case s.property != "":
		switch s.property {
		case "type":
			v = d.Type
		case "correlation_id":
			v = d.CorrelationId
		case "message_id":
			v = d.MessageId
		case "app_id":
			v = d.AppId
		}
	case s.header != "":
		switch x := d.Headers[s.header].(type) {
		case string:
			v = x
		case []byte:
			v = string(x)
		}
	}
	return v, mappable(v)
}

// mappable reports whether a producer's value may become metadata the
// stages and logs read: not empty, at most mappedValueMaxLength bytes, valid
// UTF-8, without control characters. Anything else is skipped, never cut.
func mappable(v string) bool {
	if v == "" || len(v) > mappedValueMaxLength || !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// Mapping says where Unmarshal takes the metadata Sluice and Watermill read
// when a foreign producer (Spring AMQP, .NET, a script) did not set it: the
// event type, Watermill's correlation id and, on request, the event id. Each
// field lists sources in order; the first one the delivery carries with a
// mappable value (not empty, at most 255 bytes — AMQP's short string —,
// UTF-8, without control characters) wins. A message that has the metadata
// already (the header sluice_event_type, correlation_id, sluice_event_id)
// keeps it: a mapping never overwrites.
//
// A nil field has its default; an empty one (e.g. []rabbitmq.Source{}) maps
// nothing. The zero Mapping is the defaults. Only these three keys can be
// mapped: no property or header of a producer can set one of Sluice's
// control keys (sluice.IsControlKey) or property keys this way.
//
// The mapped key is ordinary metadata: Marshal publishes it as a header, and
// a copy Sluice republishes (a tier's, the poison queue's, a replay) reads
// back the same value, whatever the reader's Mapping.
type Mapping struct {
	// EventType are the sources of the event type (sluice.EventTypeKey),
	// which the stages, metrics and `sluice dlq stats` group by.
	// Default: Header("__TypeId__") (Spring AMQP's type id), then PropertyType.
	EventType []Source
	// CorrelationID are the sources of Watermill's correlation id
	// (middleware.CorrelationIDMetadataKey, "correlation_id"), which
	// middleware.CorrelationID copies to the messages a handler produces.
	// Default: PropertyCorrelationID.
	CorrelationID []Source
	// EventID are the sources of the event id (sluice.EventIDKey), the
	// inbox's deduplication key. Default: none. A producer's message_id
	// (PropertyMessageID) is an id of one publish, not of a business event:
	// a producer that republishes an event under a new message id (an
	// outbox retry, a reconciliation job) makes a duplicate the inbox cannot
	// see, and one that reuses message ids across events makes the inbox
	// drop distinct events. Map it only from a producer that sets one
	// message_id per business event and keeps it on every publish of that
	// event (see docs/deduplication.md).
	EventID []Source
}

var (
	eventTypeSourcesDefault     = []Source{Header(springTypeIDHeader), PropertyType}
	correlationIDSourcesDefault = []Source{PropertyCorrelationID}
)

// apply sets, in md, each mapped key md has no value for.
func (mp Mapping) apply(md message.Metadata, d amqp.Delivery) {
	orDefault := func(s, def []Source) []Source {
		if s == nil {
			return def
		}
		return s
	}
	for _, t := range [...]struct {
		key     string
		sources []Source
	}{
		{sluice.EventTypeKey, orDefault(mp.EventType, eventTypeSourcesDefault)},
		{middleware.CorrelationIDMetadataKey, orDefault(mp.CorrelationID, correlationIDSourcesDefault)},
		{sluice.EventIDKey, mp.EventID},
	} {
		if md[t.key] != "" {
			continue
		}
		for _, s := range t.sources {
			if v, ok := s.value(d); ok {
				md[t.key] = v
				break
			}
		}
	}
}
