package rabbitmq

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/amqpframe"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/republish"
)

// HeadersErrorKey is set on a delivery whose headers table amqp091-go
// would refuse to read (deeper than 32 levels, a table or array of more
// than 8,192 entries, an unknown field type): Sluice's frame filter, on
// the connections of Dial, NewBroker, NewSubscriber and a watermill-amqp
// Config given to WithMarshaler, replaced the table by this one header,
// so the connection stays open. The delivery's headers are then dropped —
// none of them reaches the metadata — and its value is the reason, naming
// the top-level header and the limit: `headers unparseable: header "tags":
// an array of more than 8192 items (the client's limit)`. Only this
// process's filter can set it: a producer's header of that name is
// stripped on the way in, and dropped by Unmarshal. Delivery-scoped: never
// published.
const HeadersErrorKey = deliveryPrefix + "headers_error"

// headersReason is the diagnosis of a delivery whose headers table the
// frame filter replaced, and whether it was.
func headersReason(headers amqp.Table) (string, bool) {
	r, ok := amqpframe.Reason(headers)
	if !ok {
		return "", false
	}
	return diag.Bound("headers unparseable: "+r, 1024), true
}

// The poison stage's diagnosis keys (poison.ClassKey, ...), which the
// Consumer writes on the copy of a delivery it isolates itself: this
// package imports no stage (a test checks they are the same).
const (
	poisonClassKey      = "sluice_poison_class"
	poisonReasonKey     = "sluice_poison_reason"
	poisonQueueKey      = "sluice_poison_queue"
	poisonExchangeKey   = "sluice_poison_exchange"
	poisonRoutingKeyKey = "sluice_poison_routing_key"
	poisonDroppedKey    = "sluice_poison_dropped"
	poisonedAtKey       = "sluice_poisoned_at"
)

// Bounds of isolating a delivery with unparseable headers.
const (
	isolateTimeout = 30 * time.Second // one confirmed publish to the poison queue
	isolateBackoff = time.Second      // before the nack of one that failed
)

var errNoPoisonQueue = errors.New("rabbitmq: ConsumerConfig.PoisonQueue and PoisonPublisher are set together")

// isolate publishes a copy of d — its body and properties, no headers, the
// poison diagnosis — to the poison queue and acks d, without running the
// handler: d's headers cannot be read, and redelivering it would bring it
// back alike. A publish that fails is nacked after isolateBackoff (nothing
// lost).
func (s *subscription) isolate(ctx context.Context, d amqp.Delivery, msg *message.Message) {
	reason := msg.Metadata.Get(HeadersErrorKey)
	c := republish.Copy(msg, 7)
	c.SetContext(ctx)
	c.Metadata[poisonClassKey] = "poison"
	c.Metadata[poisonReasonKey] = reason
	c.Metadata[poisonQueueKey] = s.queue
	c.Metadata[poisonExchangeKey] = d.Exchange
	c.Metadata[poisonRoutingKeyKey] = d.RoutingKey
	c.Metadata[poisonDroppedKey] = "*" // every header of the producer's
	c.Metadata[poisonedAtKey] = time.Now().UTC().Format(time.RFC3339Nano)
	fields := diag.LogFields(watermill.LogFields{"queue": s.queue, "poison_queue": s.c.cfg.PoisonQueue, "reason": reason,
		"message_id": d.MessageId, "body_bytes": len(d.Body)})
	if err := republish.Publish(s.c.cfg.PoisonPublisher, s.c.cfg.PoisonQueue, c, isolateTimeout, isolateBackoff); err != nil {
		s.c.cfg.Logger.Error("Delivery's headers unparseable and its copy not isolated; requeued", diag.RedactError(err), fields)
		_ = d.Nack(false, true)
		return
	}
	s.c.cfg.Logger.Error("Delivery's headers unparseable; isolated in the poison queue without running the handler", nil, fields)
	_ = d.Ack(false)
}

// readDelivery returns the message of d read by m, with HeadersErrorKey set
// when the frame filter replaced d's headers table (m may be another
// marshaler than Sluice's).
func readDelivery(m wamqp.Marshaler, d amqp.Delivery) (*message.Message, error) {
	msg, err := m.Unmarshal(d)
	if err != nil {
		return nil, err
	}
	if reason, ok := headersReason(d.Headers); ok {
		delete(msg.Metadata, amqpframe.Key)
		msg.Metadata[HeadersErrorKey] = reason
	}
	return msg, nil
}
