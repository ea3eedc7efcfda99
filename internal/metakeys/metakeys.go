// Package metakeys holds the metadata keys Sluice writes for handlers and
// operators to read that are not the root's vocabulary (sluice.EventIDKey,
// ...): the AMQP delivery's and properties' keys the rabbitmq Marshaler sets,
// the origin the retry stage records, the poison stage's diagnosis and the
// replay provenance dlq writes, with the prefixes of the control keys
// (sluice.IsControlKey). None is exported by a public package: users read
// the strings from the tables of docs/rabbitmq.md (the delivery, property
// and origin keys), docs/poison.md (the diagnosis) and docs/cli.md (the
// replay provenance), which a test of rabbitmq, poison and dlq each keeps in
// step with the constants here. The strings are on the wire: never change
// one.
package metakeys

// The delivery's keys: set by the rabbitmq Marshaler for each delivery
// (computed afresh by Unmarshal) and never published by Marshal, so a
// republished copy carries no stale values and RabbitMQ's own x- headers
// are never republished as strings. docs/rabbitmq.md, "The marshaler".
const (
	// DeliveryPrefix starts every delivery-scoped key.
	DeliveryPrefix = "sluice_amqp_"

	// SourceExchange is the exchange the delivery was published to (""
	// for the default exchange): after a retry tier, the dead-letter
	// hop's, not the producer's (OriginExchange). SourceRoutingKey is the
	// routing key it was published with.
	SourceExchange   = "sluice_amqp_exchange"
	SourceRoutingKey = "sluice_amqp_routing_key"
	// Redelivered is "true" when the broker delivered the message before.
	Redelivered = "sluice_amqp_redelivered"
	// DeliveryCount is x-delivery-count (quorum queues): earlier
	// deliveries that were not acked.
	DeliveryCount = "sluice_amqp_delivery_count"
	// DeathCount sums the counts of the x-death entries: how often the
	// message was dead-lettered (a TTL tier expiring counts once per pass).
	DeathCount = "sluice_amqp_death_count"
	// FirstDeathQueue, FirstDeathReason and FirstDeathExchange are
	// x-first-death-queue, -reason and -exchange.
	FirstDeathQueue    = "sluice_amqp_first_death_queue"
	FirstDeathReason   = "sluice_amqp_first_death_reason"
	FirstDeathExchange = "sluice_amqp_first_death_exchange"

	// DeadLetterQueue and DeadLetterReason are the queue and reason of the
	// most recent x-death entry (DeadLetterExpired for a tier's TTL): the
	// stages' keyless proof that a copy came back from its own tier. The
	// rabbitmq Marshaler drops a header of these names a producer sends;
	// the embedded broker's tiers set them as well, on each copy they
	// deliver.
	DeadLetterQueue  = "sluice_amqp_last_death_queue"
	DeadLetterReason = "sluice_amqp_last_death_reason"
	// DeadLetterExpired is DeadLetterReason for a tier's TTL.
	DeadLetterExpired = "expired"

	// HeadersError is set on a delivery whose headers table amqp091-go
	// would refuse to read, which Sluice's frame filter replaced by this
	// one header (internal/amqpframe's Key is the same string): the
	// delivery's headers are dropped and its value is the reason, naming
	// the top-level header and the limit. Only this process's filter can
	// set it: a producer's header of that name is stripped on the way in,
	// and dropped by Unmarshal.
	HeadersError = "sluice_amqp_headers_error"
)

// The keys of a message's AMQP properties. Unlike the delivery-scoped keys
// they belong to the message: the rabbitmq Marshaler sets them from each
// delivery's properties, and only from them — a header of such a name is
// dropped — and Marshal restores them as properties, not headers, on every
// copy Sluice publishes (retry tiers, poison queue) and on replays.
// Expiration is never carried: the retry tiers own TTL. docs/rabbitmq.md,
// "AMQP properties".
const (
	// PropertyPrefix starts every property key.
	PropertyPrefix = "sluice_property_"

	PropertyContentType     = "sluice_property_content_type"
	PropertyContentEncoding = "sluice_property_content_encoding"
	PropertyCorrelationID   = "sluice_property_correlation_id"
	PropertyMessageID       = "sluice_property_message_id"
	PropertyType            = "sluice_property_type"
	PropertyAppID           = "sluice_property_app_id"
	PropertyReplyTo         = "sluice_property_reply_to"
	// PropertyTimestamp is the timestamp property in RFC 3339 (UTC,
	// seconds).
	PropertyTimestamp = "sluice_property_timestamp"
	// PropertyPriority is the priority property, 0-255 in decimal.
	PropertyPriority = "sluice_property_priority"
	// PropertyUserID is the user_id property the broker validated for the
	// publisher of this delivery. It is never restored as the property:
	// RabbitMQ refuses a publish whose user_id is not the publishing
	// connection's user. A copy carries it as OriginUserID instead.
	PropertyUserID = "sluice_property_user_id"
)

// The origin: facts about a message's first publish, kept on every copy.
// Control keys (sluice.IsControlKey), which the stages believe only on a
// copy Sluice wrote. docs/rabbitmq.md, "Origin".
const (
	// OriginPrefix starts every key that records where a message came from.
	OriginPrefix = "sluice_origin_"
	// OriginExchange and OriginRoutingKey are where the message was first
	// published to, recorded once by the retry-tier stage at the first
	// failure (from SourceExchange and SourceRoutingKey) and kept on every
	// later copy: after a retry tier the delivery's own exchange and
	// routing key name the dead-letter hop, not the producer's. The poison
	// diagnosis reports these when present.
	OriginExchange   = "sluice_origin_exchange"
	OriginRoutingKey = "sluice_origin_routing_key"
	// OriginUserID is the user_id the broker validated for the message's
	// first publisher. The rabbitmq Marshaler's Unmarshal sets it from a
	// delivery's user_id property; a delivery without one (a copy Sluice
	// published: RabbitMQ refuses a foreign user_id) keeps the header.
	OriginUserID = "sluice_origin_user_id"
)

// The poison stage's diagnosis, which it adds to the copy it publishes to
// the poison queue; on AMQP each is the header of the same name. The copy
// also keeps every key of the original message. docs/poison.md, "The
// diagnosis" (poison.Diagnosis lists the keys every copy carries, in its
// table's order).
const (
	// PoisonPrefix starts the poison stage's control keys: sluice_poison_*
	// and sluice_poisoned_at.
	PoisonPrefix = "sluice_poison"

	// PoisonClass is the failure class: "poison", "invariant" or
	// "exhausted".
	PoisonClass = "sluice_poison_class"
	// PoisonReason is the error summary: at most 1 KiB, valid UTF-8,
	// passwords in URLs and DSNs replaced.
	PoisonReason = "sluice_poison_reason"
	// PoisonConsumer is the consumer (Watermill handler) that failed.
	PoisonConsumer = "sluice_poison_consumer"
	// PoisonQueue is the queue the message was consumed from: where a
	// replay sends it back.
	PoisonQueue = "sluice_poison_queue"
	// PoisonExchange and PoisonRoutingKey are where the original was
	// published to (its origin).
	PoisonExchange   = "sluice_poison_exchange"
	PoisonRoutingKey = "sluice_poison_routing_key"
	// PoisonedAt is when the message was isolated (RFC 3339, UTC).
	PoisonedAt = "sluice_poisoned_at"
	// PoisonTraceID is the trace id of the failed delivery, from its
	// traceparent, when it had one.
	PoisonTraceID = "sluice_poison_trace_id"
	// PoisonStack is, for a panic, the goroutine's stack at the panic, cut
	// to 8 KiB (the whole stack is in the log line).
	PoisonStack = "sluice_poison_stack"
	// PoisonParked marks a diagnosed copy that the poison queue refused and
	// that waits in poison.Config.ParkTopic; its value is the poison
	// queue's error. When it comes back, the stage publishes it to the
	// poison queue without running the handler. Never on a copy in the
	// poison queue.
	PoisonParked = "sluice_poison_parked"
	// PoisonDropped lists, comma-separated, the metadata keys the copy left
	// out because the publisher could not carry them
	// (sluice.ErrUnpublishable: a property value AMQP cannot hold, a header
	// name over 255 bytes, a copy over the broker's frame — cut down to
	// fit, the largest first); "*" when only the diagnosis, the event's
	// keys and the failure history were kept. Absent on a copy that kept
	// everything.
	PoisonDropped = "sluice_poison_dropped"
)

// The replay provenance dlq's Queue.Replay (sluice dlq replay, the
// console's replays) writes on each copy it replays from a poison queue.
// docs/cli.md, "What a replayed message carries".
const (
	// ReplayPrefix starts the replay stage's and the replays' control keys:
	// sluice_replay_run, _item, _count and sluice_replayed_*.
	ReplayPrefix = "sluice_replay"

	// ReplayedBy is the operator who replayed the message.
	ReplayedBy = "sluice_replayed_by"
	// ReplayedAt is when it was replayed (RFC 3339, UTC, nanoseconds).
	ReplayedAt = "sluice_replayed_at"
	// ReplayedFrom is the poison queue it was replayed from.
	ReplayedFrom = "sluice_replayed_from"
	// ReplayedClass is the failure class it was poisoned with.
	ReplayedClass = "sluice_replayed_class"
	// ReplayCount is how many times the message was replayed, this replay
	// included.
	ReplayCount = "sluice_replay_count"
)

// Origin returns where a message was first published to: OriginExchange and
// OriginRoutingKey when a retry copy recorded them, else the delivery's own
// SourceExchange and SourceRoutingKey. ok is false when neither is known.
func Origin(md map[string]string) (exchange, routingKey string, ok bool) {
	if rk, found := md[OriginRoutingKey]; found {
		return md[OriginExchange], rk, true
	}
	if rk, found := md[SourceRoutingKey]; found {
		return md[SourceExchange], rk, true
	}
	return "", "", false
}
