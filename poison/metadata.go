package poison

import (
	"slices"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
)

// diagnosis is the list Diagnosis returns: the keys the poison stage adds to
// every copy it publishes (internal/metakeys holds each, with what it says),
// in the order of docs/poison.md's table. On AMQP each becomes the header of
// the same name. The copy also keeps every key of the original message,
// among them sluice.EventIDKey, sluice.EventTypeKey and sluice.LastErrorKey,
// and states the attempts made in sluice.AttemptKey and the first failure in
// sluice.FirstFailedAtKey (set when the message had none): one key per fact.
var diagnosis = []string{
	metakeys.PoisonClass, metakeys.PoisonReason, metakeys.PoisonConsumer, metakeys.PoisonQueue,
	metakeys.PoisonExchange, metakeys.PoisonRoutingKey,
	sluice.AttemptKey, sluice.FirstFailedAtKey, metakeys.PoisonedAt, metakeys.PoisonTraceID,
}

// Diagnosis returns the metadata keys (AMQP headers) of the diagnosis a
// poisoned copy carries, in the order of docs/poison.md's table, which a
// test checks against it, and a copy read back from RabbitMQ against both:
// "sluice_poison_class", "sluice_poison_reason", "sluice_poison_consumer",
// "sluice_poison_queue", "sluice_poison_exchange" and
// "sluice_poison_routing_key" (where the original was published: known on
// AMQP), sluice.AttemptKey, sluice.FirstFailedAtKey, "sluice_poisoned_at"
// and "sluice_poison_trace_id" (when the original carried a valid
// traceparent). "sluice_poison_stack" (a panic), "sluice_poison_dropped" (a
// copy cut down to fit) and "sluice_poison_parked" (a copy waiting out a
// refusal) are set only in the cases they name, and are not in it; the
// table of docs/poison.md says what each holds. The slice is the caller's.
func Diagnosis() []string { return slices.Clone(diagnosis) }
