// Package telemetry holds the OpenTelemetry names and helpers the stages
// share, so that every stage reports under one instrumentation scope.
package telemetry

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
)

// ScopeName is the instrumentation scope of every Sluice meter and tracer.
const ScopeName = "github.com/sluicemq/sluice"

// Version is the instrumentation scope's version: the version of Sluice's
// module the running binary was built with, from its build information
// ("v0.4.0" for a service that requires it, "(devel)" when Sluice itself is
// the main module), never a string to keep in step by hand.
var Version = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	if info.Main.Path == ScopeName {
		return info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == ScopeName {
			return d.Version
		}
	}
	return "(unknown)"
})

// HandlerKey is the attribute naming the handler of a delivery: the name
// given to router.Add, shared by its competing consumers — the messaging
// semantic conventions' consumer group, on spans and metrics alike.
const HandlerKey = semconv.MessagingConsumerGroupNameKey

// DurationBuckets are the explicit boundaries, in seconds, of every
// duration histogram: those the OpenTelemetry messaging semantic
// conventions recommend. OpenTelemetry's defaults are in milliseconds, and
// every observation in seconds would fall into the first bucket.
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Delivery is what router.Add tells every stage about the deliveries of
// one handler: the name it was given ("inventory", shared by its competing
// consumers' Watermill handlers "inventory-0", "inventory-1") and its
// broker's messaging system ("rabbitmq", "gochannel"). Per delivery, not per
// process: two routers with the same handler names do not meet.
type Delivery struct {
	Handler, System string
}

// deliveryKey is the context key of a *Delivery.
type deliveryKey struct{}

// With returns ctx carrying d: one context value for both facts, built once
// per handler (d is shared, never changed).
func (d *Delivery) With(ctx context.Context) context.Context {
	return context.WithValue(ctx, deliveryKey{}, d)
}

// System returns the messaging system of a delivery, "" when unknown.
func System(ctx context.Context) string {
	if d, ok := ctx.Value(deliveryKey{}).(*Delivery); ok {
		return d.System
	}
	return ""
}

// Handler returns the handler name of a delivery: the name given to
// router.Add, or the Watermill handler's name for handlers added otherwise.
func Handler(ctx context.Context) string {
	if d, ok := ctx.Value(deliveryKey{}).(*Delivery); ok {
		return d.Handler
	}
	return message.HandlerNameFromCtx(ctx)
}

// Meter returns Sluice's meter from mp, or from the global provider when mp
// is nil.
func Meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version()))
}

// Tracer returns Sluice's tracer from tp.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	return tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version()))
}

// LogFields are the fields every log line about a delivery carries: the
// handler, the event id, the message UUID and the topic — never the
// payload, and only the metadata named here.
func LogFields(msg *message.Message, more watermill.LogFields) watermill.LogFields {
	f := watermill.LogFields{
		"handler":      Handler(msg.Context()),
		"event_id":     msg.Metadata.Get(sluice.EventIDKey),
		"message_uuid": msg.UUID,
		"topic":        message.SubscribeTopicFromCtx(msg.Context()),
	}
	for k, v := range more {
		f[k] = v
	}
	return diag.LogFields(f) // the event id, the topic and what more holds come from messages
}

// DeliveryAttrs returns the attributes every per-delivery metric carries,
// those that join them with each other and with the broker's own series:
// messaging.consumer.group.name (the handler), messaging.destination.name
// (the queue consumed) and messaging.system (left out when unknown),
// followed by more.
func DeliveryAttrs(ctx context.Context, more ...attribute.KeyValue) []attribute.KeyValue {
	return HandlerAttrs(Handler(ctx), message.SubscribeTopicFromCtx(ctx), System(ctx), more...)
}

// HandlerAttrs are DeliveryAttrs of the deliveries of handler, consuming
// destination on system ("" leaves it out): what a stage needs to export
// its series at zero before the first delivery.
func HandlerAttrs(handler, destination, system string, more ...attribute.KeyValue) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 3+len(more))
	attrs = append(attrs, HandlerKey.String(handler), semconv.MessagingDestinationName(destination))
	if system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(system))
	}
	return append(attrs, more...)
}

// DeliveryAttr is DeliveryAttrs of a message's context as a measurement
// option.
func DeliveryAttr(msg *message.Message, more ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(DeliveryAttrs(msg.Context(), more...)...)
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
