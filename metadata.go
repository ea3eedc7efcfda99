package sluice

// Metadata keys shared by the stages. On AMQP each becomes the header of the
// same name.
const (
	// EventIDKey is the business event id a producer gives an event, stable
	// across redeliveries and republishing, unlike the broker's or
	// Watermill's message id. The deduplication stage reads it by default and
	// sets it from its key function when it is missing, so retry copies and
	// poison diagnoses carry it.
	EventIDKey = "sluice_event_id"
	// EventTypeKey is the event's type (e.g. "order.created"), when the
	// producer sets it; the poison diagnosis and the operator CLI group by it.
	EventTypeKey = "sluice_event_type"
	// AttemptKey is the attempt number of this delivery: absent or "1" on the
	// first, set on each retry copy by retrytiers.
	AttemptKey = "sluice_attempt"
	// FirstFailedAtKey is when the first attempt failed (RFC 3339, UTC).
	FirstFailedAtKey = "sluice_first_failed_at"
	// LastErrorKey is the bounded, redacted summary of the last failure.
	LastErrorKey = "sluice_last_error"
	// RetryTierKey names the retry tier the copy went through last.
	RetryTierKey = "sluice_retry_tier"
	// CopyIDKey is, on a copy Sluice publishes (retry tier, poison queue,
	// park topic), the copy's identity — also its message UUID (on AMQP
	// the _watermill_message_uuid header): derived from the delivery
	// (its event id, else its message id, the attempt, the kind of copy),
	// not drawn at random, so that a copy made twice after an uncertain
	// publish (ErrPublishUncertain) carries the same id both times and is
	// counted once (`sluice dlq stats` items, replay items). An identity,
	// not a control fact: no stage acts on it, and it is not signed.
	CopyIDKey = "sluice_copy_id"
	// TraceparentKey is the W3C trace context of the producer.
	TraceparentKey = "traceparent"
	// PreviousTraceparentKey is, on a retry or poison copy, the W3C trace
	// context of the delivery that failed: the next delivery's span links to
	// it, so a trace shows the whole path through the tiers.
	PreviousTraceparentKey = "sluice_previous_traceparent"
)
