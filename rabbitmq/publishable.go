package rabbitmq

import (
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
)

// maxMessageSizeDefault is Connection.MaxMessageSize's default: RabbitMQ
// 3.x's max_message_size (128 MiB), the largest default a broker has. Not
// 4.x's 16 MiB: on a 3.x broker that would refuse the retry-tier and poison
// copies of messages between 16 and 128 MiB the broker delivered. On 4.x set
// it to 16 MiB (or your broker's setting) to have the outbox refuse larger
// rows when they are written; without it the broker refuses them at the
// relay, which sets each aside with its reason.
const maxMessageSizeDefault = 128 << 20

// headersMaxEntries is the most entries a headers table (or an array or
// table inside it) may have for Sluice's AMQP client to read it: a
// delivery with more is isolated without running its handler
// (sluice_amqp_headers_error), and a basic.return with more cannot be
// matched to its publish. Publisher.CheckPublish refuses a message with more.
const headersMaxEntries = 8192

// headersMaxDepth is how deeply tables and arrays may nest for Sluice's
// AMQP client to read them.
const headersMaxDepth = 32

// maxPublishID is the longest publishIDHeader value: the frame check of a
// message not yet on a channel counts it.
const maxPublishID = "18446744073709551615"

var (
	// errMessageTooLarge is matched by a publish (or CheckPublish) of a
	// body larger than Connection.MaxMessageSize: RabbitMQ would refuse it
	// by closing the channel (406), failing every publish in flight on it.
	errMessageTooLarge = errors.New("rabbitmq: the body is larger than the broker's max_message_size")
	// errRoutingHeader is matched by a publish (or CheckPublish) of a
	// message whose CC or BCC header is not an array: RabbitMQ reads these
	// headers as extra routing keys (sender-selected distribution) and
	// closes the channel (406) for one of another type — a metadata value
	// is a string.
	errRoutingHeader = errors.New("rabbitmq: CC and BCC are routing headers the broker interprets: only an array of routing keys is accepted")
	// errTooManyHeaders is matched by CheckPublish's error for a message
	// whose headers Sluice's AMQP client could not read back
	// (more than 8192 entries in a table or array).
	errTooManyHeaders = errors.New("rabbitmq: more headers than the AMQP client reads")
)

// checkPublishing returns a *sluice.UnpublishableError for a publishing the
// broker would refuse by closing the channel or the connection: a body
// over maxSize, a CC or BCC header that is not an array, a content header
// that does not fit a frame of frameMax (0: unlimited) or that amqp091
// cannot encode.
func checkPublishing(pub amqp.Publishing, frameMax, maxSize int) error {
	if maxSize > 0 && len(pub.Body) > maxSize {
		return &sluice.UnpublishableError{Err: fmt.Errorf("%w: %d bytes, over %d (Connection.MaxMessageSize)", errMessageTooLarge, len(pub.Body), maxSize)}
	}
	for _, k := range [...]string{"CC", "BCC"} {
		if v, ok := pub.Headers[k]; ok {
			if _, array := v.([]any); !array {
				return &sluice.UnpublishableError{Key: k, Err: errRoutingHeader}
			}
		}
	}
	if err := checkFrame(pub, frameMax); err != nil {
		return &sluice.UnpublishableError{Err: err}
	}
	return nil
}

// CheckPublish returns an error matching sluice.ErrUnpublishable when
// Publish would refuse msg to topic, or the broker could not carry it, for
// a reason that holds whenever it is published (broker.PublishChecker): a
// routing key or header name over 255 bytes, a property value AMQP cannot
// carry, a CC or BCC header that is not an array (the broker reads them
// as routing keys), a body over Connection.MaxMessageSize, headers that do
// not fit one frame (*FrameSizeError: the negotiated frame_max once
// connected, else the client's 128 KiB), or more than 8192 entries in a
// table or array (a consumer with Sluice's client could not read them);
// for a Broker's PartitionPublisher, a message without the partition key
// (ErrNoPartitionKey). The error's text names which. A PartitionPublisher
// also refuses a topic other than its exchange, with an error of its own.
// It publishes nothing and does not connect. The outbox applies it when a
// message is written (sluicesql.OutboxConfig.Checker).
func (p *Publisher) CheckPublish(topic string, msg *message.Message) error {
	if err := p.checkPartition(topic, msg); err != nil {
		return err
	}
	if err := broker.CheckName("routing key", topic); err != nil {
		return &sluice.UnpublishableError{Err: err}
	}
	pub, err := p.cfg.Marshaler.Marshal(msg)
	if err != nil {
		if errors.Is(err, sluice.ErrUnpublishable) {
			return err
		}
		return &sluice.UnpublishableError{Err: fmt.Errorf("rabbitmq: marshaling the message: %w", err)}
	}
	headers := maps.Clone(pub.Headers)
	if headers == nil {
		headers = amqp.Table{}
	}
	headers[publishIDHeader] = maxPublishID
	pub.Headers = headers
	if err := checkEntries(headers, 0); err != nil {
		return &sluice.UnpublishableError{Err: err}
	}
	return checkPublishing(pub, int(p.frameMax.Load()), p.cfg.MaxMessageSize)
}

// checkEntries returns an error matching errTooManyHeaders when v, at
// nesting depth, is a table or array Sluice's AMQP client cannot read.
func checkEntries(v any, depth int) error {
	var n int
	var children iter.Seq[any]
	switch x := v.(type) {
	case amqp.Table:
		n, children = len(x), maps.Values(x)
	case []any:
		n, children = len(x), slices.Values(x)
	default:
		return nil
	}
	switch {
	case depth > headersMaxDepth:
		return fmt.Errorf("%w: tables or arrays nested deeper than %d", errTooManyHeaders, headersMaxDepth)
	case n > headersMaxEntries:
		return fmt.Errorf("%w: %d entries in one table or array, over %d", errTooManyHeaders, n, headersMaxEntries)
	}
	for c := range children {
		if err := checkEntries(c, depth+1); err != nil {
			return err
		}
	}
	return nil
}
