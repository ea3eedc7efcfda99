package poison

import (
	"slices"

	"github.com/sluicemq/sluice"
)

// Diagnosis metadata keys the poison stage adds to the copy it publishes. On
// AMQP each becomes the header of the same name. The copy also keeps every
// key of the original message, among them sluice.EventIDKey,
// sluice.EventTypeKey and sluice.LastErrorKey, and states the attempts made
// in sluice.AttemptKey and the first failure in sluice.FirstFailedAtKey (set
// when the message had none): one key per fact.
const (
	// ClassKey is the failure class: "poison", "invariant" or "exhausted".
	ClassKey = "sluice_poison_class"
	// ReasonKey is the error summary: at most 1 KiB,
	// valid UTF-8, passwords in URLs and DSNs replaced.
	ReasonKey = "sluice_poison_reason"
	// ConsumerKey is the consumer (Watermill handler) that failed.
	ConsumerKey = "sluice_poison_consumer"
	// QueueKey is the queue the message was consumed from: where a replay
	// sends it back.
	QueueKey = "sluice_poison_queue"
	// ExchangeKey and RoutingKeyKey are where the original was published to.
	ExchangeKey   = "sluice_poison_exchange"
	RoutingKeyKey = "sluice_poison_routing_key"
	// PoisonedAtKey is when the message was isolated (RFC 3339, UTC).
	PoisonedAtKey = "sluice_poisoned_at"
	// StackKey is, for a panic, the goroutine's stack at the panic, cut to
	// 8 KiB (the whole stack is in the log line).
	StackKey = "sluice_poison_stack"
	// TraceIDKey is the trace id of the failed delivery, from its
	// traceparent, when it had one.
	TraceIDKey = "sluice_poison_trace_id"
	// ParkedKey marks a diagnosed copy that the poison queue refused and
	// that waits in Config.ParkTopic; its value is the poison queue's error.
	// When it comes back, the stage publishes it to the poison queue without
	// running the handler. Never on a copy in the poison queue.
	ParkedKey = "sluice_poison_parked"
	// DroppedKey lists, comma-separated, the metadata keys the copy left
	// out because the publisher could not carry them (sluice.
	// ErrUnpublishable: a property value AMQP cannot hold, a header name
	// over 255 bytes, a copy over the broker's frame — cut down to fit, the
	// largest first); "*" when only the diagnosis, the event's keys and the
	// failure history were kept. Absent on a copy that kept everything.
	DroppedKey = "sluice_poison_dropped"
)

// diagnosis is the list Diagnosis returns.
var diagnosis = []string{
	ClassKey, ReasonKey, ConsumerKey, QueueKey, ExchangeKey, RoutingKeyKey,
	sluice.AttemptKey, sluice.FirstFailedAtKey, PoisonedAtKey, TraceIDKey,
}

// Diagnosis returns the metadata keys (AMQP headers) of the diagnosis a
// poisoned copy carries, in the order of docs/poison.md's table, which a
// test checks against it, and a copy read back from RabbitMQ against both:
// ClassKey, ReasonKey, ConsumerKey, QueueKey, ExchangeKey and RoutingKeyKey
// (where the original was published: known on AMQP), sluice.AttemptKey,
// sluice.FirstFailedAtKey, PoisonedAtKey and TraceIDKey (when the original
// carried a valid traceparent). StackKey (a panic), DroppedKey (a copy cut
// down to fit) and ParkedKey (a copy waiting out a refusal) are set only in
// the cases they name, and are not in it. The slice is the caller's.
func Diagnosis() []string { return slices.Clone(diagnosis) }
