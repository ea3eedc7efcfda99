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
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/republish"
)

// headersReason is the diagnosis of a delivery whose headers table the
// frame filter replaced, and whether it was.
func headersReason(headers amqp.Table) (string, bool) {
	r, ok := amqpframe.Reason(headers)
	if !ok {
		return "", false
	}
	return diag.Bound("headers unparseable: "+r, 1024), true
}

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
	reason := msg.Metadata.Get(metakeys.HeadersError)
	c := republish.Copy(msg, 7)
	c.SetContext(ctx)
	c.Metadata[metakeys.PoisonClass] = "poison"
	c.Metadata[metakeys.PoisonReason] = reason
	c.Metadata[metakeys.PoisonQueue] = s.queue
	c.Metadata[metakeys.PoisonExchange] = d.Exchange
	c.Metadata[metakeys.PoisonRoutingKey] = d.RoutingKey
	c.Metadata[metakeys.PoisonDropped] = "*" // every header of the producer's
	c.Metadata[metakeys.PoisonedAt] = time.Now().UTC().Format(time.RFC3339Nano)
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

// readDelivery returns the message of d read by m, with
// sluice_amqp_headers_error set when the frame filter replaced d's headers
// table (m may be another marshaler than Sluice's).
func readDelivery(m wamqp.Marshaler, d amqp.Delivery) (*message.Message, error) {
	msg, err := m.Unmarshal(d)
	if err != nil {
		return nil, err
	}
	if reason, ok := headersReason(d.Headers); ok {
		delete(msg.Metadata, amqpframe.Key)
		msg.Metadata[metakeys.HeadersError] = reason
	}
	return msg, nil
}
