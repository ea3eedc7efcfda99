package telemetry

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/semconv/v1.37.0/messagingconv"

	"github.com/sluicemq/sluice"
)

// The counters below are created here, by the stages that increment them
// and by the export at zero (router.ExportCountersAtZero) alike, so that
// both name and describe them the same way.

// OperationProcess is messaging.operation.name of the Trace stage's spans
// and of messaging.client.consumed.messages.
const OperationProcess = "process"

// PoisonedCounter is sluice.poisoned.
func PoisonedCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	return Meter(mp).Int64Counter(MetricPoisoned, metric.WithDescription("Messages isolated in the poison queue."))
}

// DuplicatesCounter is sluice.inbox.duplicates.
func DuplicatesCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	dup, err := Meter(mp).Int64Counter(MetricInboxDuplicates,
		metric.WithDescription("Deliveries skipped because their key was already processed."))
	if err != nil {
		return nil, fmt.Errorf("deduplication: creating %s counter: %w", MetricInboxDuplicates, err)
	}
	return dup, nil
}

// RetryCounters are sluice.retries and sluice.exhausted.
func RetryCounters(mp metric.MeterProvider) (retries, exhausted metric.Int64Counter, err error) {
	meter := Meter(mp)
	if retries, err = meter.Int64Counter(MetricRetries, metric.WithDescription("Copies published to a retry tier.")); err != nil {
		return nil, nil, err
	}
	exhausted, err = meter.Int64Counter(MetricExhausted, metric.WithDescription("Transient failures whose retry budget was spent."))
	return retries, exhausted, err
}

// ConsumedAttrs is the attribute set of messaging.client.consumed.messages
// and messaging.process.duration for one delivery's outcome: class and
// errorType are left out when empty, system too.
func ConsumedAttrs(handler, dest, system string, outcome sluice.Outcome, class, errorType string) attribute.Set {
	attrs := []attribute.KeyValue{HandlerKey.String(handler), semconv.MessagingDestinationName(dest),
		semconv.MessagingOperationName(OperationProcess), AttrOutcome.String(string(outcome))}
	if system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(system))
	}
	if class != "" {
		attrs = append(attrs, AttrClass.String(class))
	}
	if errorType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errorType))
	}
	return attribute.NewSet(attrs...)
}

// ZeroPoisoned exports sluice.poisoned at zero for one handler, one series
// per class the poison stage isolates.
func ZeroPoisoned(mp metric.MeterProvider, classes []sluice.Class, handler, queue, system string) error {
	poisoned, err := PoisonedCounter(mp)
	if err != nil {
		return err
	}
	for _, class := range classes {
		poisoned.Add(context.Background(), 0, metric.WithAttributes(
			HandlerAttrs(handler, queue, system, semconv.ErrorTypeKey.String(class.String()))...))
	}
	return nil
}

// ZeroRetries exports sluice.retries at zero for each of a handler's tiers
// (by name), and sluice.exhausted.
func ZeroRetries(mp metric.MeterProvider, tiers []string, handler, queue, system string) error {
	retries, exhausted, err := RetryCounters(mp)
	if err != nil {
		return err
	}
	transient := semconv.ErrorTypeKey.String(sluice.ClassTransient.String())
	for _, t := range tiers {
		retries.Add(context.Background(), 0, metric.WithAttributes(
			HandlerAttrs(handler, queue, system, AttrTier.String(t), transient)...))
	}
	exhausted.Add(context.Background(), 0, metric.WithAttributes(
		HandlerAttrs(handler, queue, system, semconv.ErrorTypeKey.String(sluice.ClassExhausted.String()))...))
	return nil
}

// ZeroDuplicates exports sluice.inbox.duplicates at zero for one handler.
func ZeroDuplicates(mp metric.MeterProvider, handler, queue, system string) error {
	dup, err := DuplicatesCounter(mp)
	if err != nil {
		return err
	}
	dup.Add(context.Background(), 0, metric.WithAttributes(HandlerAttrs(handler, queue, system)...))
	return nil
}

// ZeroConsumed exports messaging.client.consumed.messages at zero for one
// handler: its failed deliveries of each class, and of none.
func ZeroConsumed(mp metric.MeterProvider, handler, queue, system string) error {
	consumed, err := messagingconv.NewClientConsumedMessages(Meter(mp))
	if err != nil {
		return fmt.Errorf("stage: creating %s: %w", MetricConsumed, err)
	}
	consumed.AddSet(context.Background(), 0, ConsumedAttrs(handler, queue, system, sluice.OutcomeFailed, "", "")) // a failure of no class
	for c := sluice.ClassTransient; c.Valid(); c++ {
		consumed.AddSet(context.Background(), 0, ConsumedAttrs(handler, queue, system, sluice.OutcomeFailed, c.String(), c.String()))
	}
	return nil
}
