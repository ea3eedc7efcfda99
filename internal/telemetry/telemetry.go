// Package telemetry holds the OpenTelemetry names and helpers the stages
// share, so that every stage reports under one instrumentation scope.
package telemetry

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice/internal/diag"
)

// ScopeName is the instrumentation scope of every Sluice meter and tracer.
const ScopeName = "github.com/sluicemq/sluice"

// HandlerKey is the attribute naming the Watermill handler of a delivery.
const HandlerKey = attribute.Key("sluice.handler")

// Meter returns Sluice's meter from mp, or from the global provider when mp
// is nil.
func Meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(ScopeName)
}

// HandlerAttr returns the handler attribute of a delivery as a measurement
// option ("" when the message is not handled by a Watermill router).
func HandlerAttr(msg *message.Message) metric.MeasurementOption {
	return metric.WithAttributes(HandlerKey.String(message.HandlerNameFromCtx(msg.Context())))
}

// Traceparent returns the W3C traceparent of the span in ctx, or "" when
// ctx holds no valid span.
func Traceparent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// ParseTraceparent returns the span context of a W3C traceparent; it is
// invalid (IsValid false) for "" or a malformed value.
func ParseTraceparent(tp string) trace.SpanContext {
	if tp == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	return trace.SpanContextFromContext(ctx)
}

// RecordError adds the exception event of err to span as span.RecordError
// does — exception.type the error's Go type — with exception.message
// redacted (diag.Redact): no password of a URL or DSN reaches a span.
func RecordError(span trace.Span, err error) {
	if err == nil || !span.IsRecording() {
		return
	}
	span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(
		semconv.ExceptionType(fmt.Sprintf("%T", err)),
		semconv.ExceptionMessage(diag.Redact(err.Error())),
	))
}
