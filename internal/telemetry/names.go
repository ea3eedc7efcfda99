package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
)

// The names of Sluice's telemetry: every instrument, span attribute and
// metric attribute a stage or broker defines, in one place. They are not
// public API: users read them from docs/observability.md, and
// TestTheDocsNameEveryInstrumentAndAttribute fails when this file and the
// document drift apart (a name added, renamed or removed on one side only),
// or when a name is written as a literal anywhere else in the module.

// Instruments of the Trace stage: the OpenTelemetry messaging semantic
// conventions' (semconv v1.37.0, messagingconv).
const (
	// MetricConsumed counts deliveries handed to the handler, by
	// messaging.consumer.group.name (the handler), messaging.destination.name,
	// messaging.system, messaging.operation.name ("process"), sluice.outcome,
	// sluice.class and, for a failed or poisoned delivery, error.type.
	MetricConsumed = "messaging.client.consumed.messages"
	// MetricProcessDuration is the time from the Trace stage to the router,
	// in seconds, with MetricConsumed's attributes but sluice.class.
	MetricProcessDuration = "messaging.process.duration"
)

// Instruments of the inbox (deduplication).
const (
	// MetricInboxDuplicates counts deliveries acked without running the
	// handler because their key was already processed, by handler.
	MetricInboxDuplicates = "sluice.inbox.duplicates"
	// MetricInboxPruned counts inbox records deleted by a Pruner.
	MetricInboxPruned = "sluice.inbox.pruned"
	// MetricInboxBatchSize is the histogram of the deliveries one group
	// commit committed, by handler.
	MetricInboxBatchSize = "sluice.inbox.batch.size"
)

// MetricRejected counts deliveries acked because the handler rejected them
// (sluice.ClassRejected), by handler (middleware.Classify).
const MetricRejected = "sluice.rejected"

// Instruments of the retry tiers.
const (
	MetricRetries   = "sluice.retries"   // copies published to a tier, by tier
	MetricExhausted = "sluice.exhausted" // transient failures whose budget was spent
)

// Instruments of the poison stage.
const (
	// MetricPoisoned counts messages isolated in the poison queue, by class.
	MetricPoisoned = "sluice.poisoned"
	// MetricPoisonParked counts diagnosed copies the poison queue refused
	// and that were parked to be isolated when they come back
	// (poison.Config.ParkTopic).
	MetricPoisonParked = "sluice.poison.parked"
)

// Instruments of the brake, by handler.
const (
	// MetricBrakeState is a gauge of the brake's State: 0 released,
	// 1 engaged, 2 probing.
	MetricBrakeState = "sluice.brake.state"
	// MetricBrakeTransitions counts changes of state, by the state entered
	// (AttrBrakeState).
	MetricBrakeTransitions = "sluice.brake.transitions"
	// MetricBrakeHeld counts deliveries given back unprocessed.
	MetricBrakeHeld = "sluice.brake.held"
	// MetricBrakeProbes counts probes, by AttrBrakeProbe (what probed) and
	// AttrBrakeProbeResult.
	MetricBrakeProbes = "sluice.brake.probes"
)

// Instruments of the replay stage, by handler.
const (
	// MetricReplayOutcomes counts the outcomes the stage recorded, by
	// sluice.outcome: a rise of "poisoned" while a replay runs is the
	// closed loop's stop signal, seen from the consumers.
	MetricReplayOutcomes = "sluice.replay.outcomes"
	// MetricReplayRecordFailures counts the records the Store refused or
	// did not take within replay.Config.StoreTimeout: their items stay
	// without an outcome (and `sluice dlq replay` waits out --wait) until
	// redelivered.
	MetricReplayRecordFailures = "sluice.replay.record_failures"
)

// Instruments of the outbox relay, by outbox (AttrOutbox); Prometheus:
// sluice_outbox_relayed_total, sluice_outbox_failures_total,
// sluice_outbox_pending, sluice_outbox_failing,
// sluice_outbox_oldest_age_seconds, sluice_outbox_lag_seconds,
// sluice_outbox_dead_lettered_total, sluice_outbox_dead.
const (
	MetricOutboxRelayed   = "sluice.outbox.relayed"
	MetricOutboxFailures  = "sluice.outbox.failures"
	MetricOutboxPending   = "sluice.outbox.pending"
	MetricOutboxFailing   = "sluice.outbox.failing"
	MetricOutboxOldestAge = "sluice.outbox.oldest.age"
	MetricOutboxLag       = "sluice.outbox.lag"
	// MetricOutboxDeadLettered counts the rows set aside as dead, by
	// destination.
	MetricOutboxDeadLettered = "sluice.outbox.dead_lettered"
	// MetricOutboxDead is the number of dead rows waiting for an operator.
	MetricOutboxDead = "sluice.outbox.dead"
)

// Instruments of the ordering stage, by handler (AttrHandler).
const (
	MetricOrderHeld      = "sluice.order.held"       // counter: deliveries held behind their key's head
	MetricOrderReleased  = "sluice.order.released"   // counter: held messages released, by sluice.outcome
	MetricOrderBlocked   = "sluice.order.blocked"    // counter: keys that began to wait for a head
	MetricOrderKeys      = "sluice.order.keys"       // gauge: waiting keys, by sluice.order.state (blocked, poisoned, releasing)
	MetricOrderWaiting   = "sluice.order.waiting"    // gauge: messages held behind waiting keys
	MetricOrderOldestAge = "sluice.order.oldest_age" // gauge: seconds since the oldest waiting key began to wait
)

// Instruments of a rabbitmq.Broker: the depth gauges, read with a passive
// queue.declare, without RabbitMQ's rabbitmq_prometheus plugin
// (docs/alerts.yml), and its confirmed publisher's.
const (
	// MetricQueueReady is a queue's messages ready for delivery, as
	// RabbitMQ's queue.declare-ok counts them: those delivered and not yet
	// acknowledged are not among them (RabbitMQ 3.10, classic and quorum
	// queues alike).
	MetricQueueReady = "sluice.queue.messages.ready"
	// MetricQueueConsumers is a queue's consumers.
	MetricQueueConsumers = "sluice.queue.consumers"
	// MetricPublishConfirmDuration is the time from publishing a message to
	// its confirm (or return, nack, closed channel, timeout), in seconds, by
	// messaging.system ("rabbitmq"), messaging.destination.name (the routing
	// key) and AttrConfirm ("acked", "returned", "nacked", "closed",
	// "returned_unmatched" — a return that could be this message's, see
	// rabbitmq.Publisher.Publish — "timeout").
	MetricPublishConfirmDuration = "sluice.publish.confirm.duration"
	// MetricPublishReconnects counts the publisher reopening its channel
	// after it closed, by messaging.system and AttrReconnect: "channel" (the
	// broker closed the channel, as for a missing exchange), "connection"
	// (the connection closed with it: a broker restart, a node of a cluster
	// gone, a network fault, or a frame the broker refused) or "nacked" (the
	// broker nacked a publish on it: the next publish opens a new channel).
	// A message the Publisher cannot carry never closes either: it is
	// refused before it is sent (sluice.ErrUnpublishable).
	MetricPublishReconnects = "sluice.publish.reconnects"
)

// Attribute keys Sluice adds to the messaging semantic conventions, on the
// spans and the metrics of a delivery.
const (
	AttrOutcome     = attribute.Key("sluice.outcome")
	AttrClass       = attribute.Key("sluice.class")
	AttrTier        = attribute.Key("sluice.tier")
	AttrAttempt     = attribute.Key("sluice.attempt")      // the delivery's attempt number
	AttrNextAttempt = attribute.Key("sluice.next_attempt") // a retry copy's attempt number
	AttrEventID     = attribute.Key("sluice.event_id")
	AttrReason      = attribute.Key("sluice.reason")
	// AttrLink marks the link from a retry or poison copy's span to the
	// span of the delivery that failed ("previous attempt").
	AttrLink = attribute.Key("sluice.link")
)

// InstanceKey is the span attribute naming the Watermill handler, one per
// competing consumer ("inventory-0"); metrics leave it out.
const InstanceKey = attribute.Key("sluice.handler.instance")

// AttrHandler names the handler on the ordering stage's instruments.
const AttrHandler = attribute.Key("sluice.handler")

// AttrOrderState is the state of the waiting keys MetricOrderKeys counts:
// "blocked", "poisoned" or "releasing".
const AttrOrderState = attribute.Key("sluice.order.state")

// Attributes of the brake's instruments and spans.
const (
	// AttrBrakeState is the state attribute of MetricBrakeTransitions and
	// of the spans: the state entered.
	AttrBrakeState = attribute.Key("sluice.brake.state")
	// AttrBrakeFrom is the state left, on the span of a change of state.
	AttrBrakeFrom = attribute.Key("sluice.brake.from")
	// AttrBrakeProbe is "dependency" (brake.Config.Probe, no message
	// touched) or "delivery" (one delivery let through).
	AttrBrakeProbe = attribute.Key("sluice.brake.probe")
	// AttrBrakeProbeResult is "passed", "failed" or, for a delivery whose
	// outcome says nothing about the dependency (a poison message),
	// "inconclusive".
	AttrBrakeProbeResult = attribute.Key("sluice.brake.probe.result")
)

// AttrOutbox names the outbox (outbox.RelayConfig.Name) on the relay's
// instruments.
const AttrOutbox = attribute.Key("sluice.outbox")

// Attribute keys of a rabbitmq.Broker's instruments.
const (
	AttrQueueRole   = attribute.Key("sluice.queue.role")   // "main", "tier", "poison"
	AttrQueueFamily = attribute.Key("sluice.queue.family") // the consumer queue
	AttrQueueVhost  = attribute.Key("sluice.queue.vhost")
	AttrConfirm     = attribute.Key("sluice.confirm")   // of MetricPublishConfirmDuration
	AttrReconnect   = attribute.Key("sluice.reconnect") // of MetricPublishReconnects
)

// The span of one group commit of the inbox (deduplication's batched
// handler) and its attributes.
const (
	SpanBatch          = "sluice.batch"
	AttrBatchSize      = attribute.Key("sluice.batch.size")
	AttrBatchCommitted = attribute.Key("sluice.batch.committed")
	AttrBatchAttempts  = attribute.Key("sluice.batch.attempts")
	AttrConsumer       = attribute.Key("sluice.consumer")
)

// SemconvAttributes are the semantic conventions' attribute keys Sluice
// puts on its spans and instruments: docs/observability.md may name these
// and Sluice's own names above, no other.
var SemconvAttributes = []attribute.Key{
	semconv.MessagingSystemKey,
	semconv.MessagingOperationTypeKey,
	semconv.MessagingOperationNameKey,
	semconv.MessagingDestinationNameKey,
	semconv.MessagingMessageIDKey,
	semconv.MessagingConsumerGroupNameKey,
	semconv.MessagingRabbitMQDestinationRoutingKeyKey,
	semconv.ErrorTypeKey,
}
