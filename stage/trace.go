package stage

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/semconv/v1.37.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice/internal/diag"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// TraceConfig configures the Trace stage and TracingPublisher.
type TraceConfig struct {
	// Env is the shared environment (router.Stages and service give theirs;
	// the fields set here win). The Trace stage reads TracerProvider and
	// MeterProvider (default the global providers).
	sluice.Env
	// Propagator reads (and, in TracingPublisher, writes) the trace context
	// in message metadata. Default W3C trace context and baggage; pass
	// otel.GetTextMapPropagator() to use the global one.
	Propagator propagation.TextMapPropagator
	// System is messaging.system, e.g. "rabbitmq". Default: the broker's
	// given by router.Add, else left out.
	System string
}

// withDefaults returns a copy of c with its defaults filled.
func (c TraceConfig) withDefaults() TraceConfig {
	c.TracerProvider = cmp.Or(c.TracerProvider, otel.GetTracerProvider())
	c.Propagator = cmp.Or(c.Propagator, propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return c
}

// Trace returns the outermost stage: one consumer span per delivery,
// parented by the producer's context from the metadata and linked to the
// failed delivery a retry copy came from (sluice.PreviousTraceparentKey), with the
// messaging semantic-convention attributes and the delivery's outcome (see
// sluice.Report) as attributes and an event. The span's status is Error when
// a failure reached the router (sluice.OutcomeFailed) and when the delivery
// was poisoned (poison, invariant, exhausted): acked, but a failure all the
// same; a retried, rejected or duplicate delivery is not an error. Every
// failed delivery has error.type, its failure class. A panic's stack is on
// the span as an exception event's exception.stacktrace. It also counts
// messaging.client.consumed.messages and records messaging.process.duration,
// by handler — the name given to router.Add, shared by its competing
// consumers. Safe for concurrent use.
func Trace(cfg TraceConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	tracer := telemetry.Tracer(cfg.TracerProvider)
	meter := telemetry.Meter(cfg.MeterProvider)
	consumed, err := messagingconv.NewClientConsumedMessages(meter)
	if err != nil {
		return nil, fmt.Errorf("middleware: creating %s: %w", telemetry.MetricConsumed, err)
	}
	duration, err := messagingconv.NewProcessDuration(meter, metric.WithExplicitBucketBoundaries(telemetry.DurationBuckets...))
	if err != nil {
		return nil, fmt.Errorf("middleware: creating %s: %w", telemetry.MetricProcessDuration, err)
	}
	fields := cfg.Propagator.Fields()
	var attrSets sync.Map // metricKey → attribute.Set, built once per combination
	measure := func(k metricKey) attribute.Set {
		if o, ok := attrSets.Load(k); ok {
			return o.(attribute.Set)
		}
		o, _ := attrSets.LoadOrStore(k, k.attrs())
		return o.(attribute.Set)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			orig := msg.Context()
			handler := telemetry.Handler(orig)
			dest := message.SubscribeTopicFromCtx(orig)
			parent := orig
			for _, f := range fields { // no trace context in the metadata: nothing to extract
				if _, ok := msg.Metadata[f]; ok {
					parent = cfg.Propagator.Extract(orig, propagation.MapCarrier(msg.Metadata))
					break
				}
			}
			opts := consumerKind // shared: no allocation for a first delivery
			if prev := previousSpan(msg); prev.IsValid() {
				opts = []trace.SpanStartOption{consumerKind[0], trace.WithLinks(trace.Link{SpanContext: prev, Attributes: []attribute.KeyValue{
					telemetry.AttrLink.String("previous attempt")}})}
			}
			ctx, span := tracer.Start(parent, "process "+dest, opts...)
			defer span.End()
			if span.IsRecording() { // attributes cost allocations: only for spans kept
				span.SetAttributes(
					semconv.MessagingOperationTypeProcess,
					semconv.MessagingOperationName(telemetry.OperationProcess),
					semconv.MessagingDestinationName(dest),
					semconv.MessagingMessageID(msg.UUID),
					semconv.MessagingConsumerGroupName(handler),
					telemetry.InstanceKey.String(message.HandlerNameFromCtx(orig)),
				)
				if rk, ok := msg.Metadata[metakeys.SourceRoutingKey]; ok && cfg.System == "rabbitmq" {
					span.SetAttributes(semconv.MessagingRabbitMQDestinationRoutingKey(rk))
				}
				if n, err := sluice.Attempt(msg); err == nil { // a forged attempt is not reported
					span.SetAttributes(telemetry.AttrAttempt.Int(n))
				}
				if system := cmp.Or(cfg.System, telemetry.System(orig)); system != "" {
					span.SetAttributes(semconv.MessagingSystemKey.String(system))
				}
				if id := msg.Metadata.Get(sluice.EventIDKey); id != "" {
					span.SetAttributes(telemetry.AttrEventID.String(id))
				}
			}
			report := sluice.ReportFromContext(ctx) // an observer's around the stack (sluicetest)
			if report == nil {
				ctx, report = sluice.WithReport(ctx)
			}
			msg.SetContext(ctx)
			start := time.Now()

			produced, err := h(msg)

			msg.SetContext(orig)
			switch report.Settle(err) {
			case sluice.OutcomeFailed:
				telemetry.RecordError(span, err) // exception.message redacted, as the status
				span.SetStatus(codes.Error, diag.Summary(err, 256))
			case sluice.OutcomePoisoned:
				span.SetStatus(codes.Error, report.Class.String()+": "+report.Reason)
			}
			if span.IsRecording() {
				annotate(span, report)
			}
			k := metricKey{handler: handler, dest: dest, system: cmp.Or(cfg.System, telemetry.System(orig)), outcome: report.Outcome}
			if report.Class.Valid() && (report.Outcome == sluice.OutcomeFailed || report.Outcome == sluice.OutcomePoisoned) {
				k.errorType = report.Class.String()
			}
			if duration.Enabled(ctx) {
				duration.RecordSet(ctx, time.Since(start).Seconds(), measure(k))
			}
			if consumed.Enabled(ctx) {
				if report.Class.Valid() {
					k.class = report.Class.String()
				}
				consumed.AddSet(ctx, 1, measure(k))
			}
			return produced, err
		}
	}, nil
}

// consumerKind is the start option of every consumer span.
var consumerKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// metricKey selects a cached attribute set of the Trace stage's metrics.
type metricKey struct {
	handler, dest, system string
	outcome               sluice.Outcome
	class, errorType      string
}

// attrs is the attribute set of k.
func (k metricKey) attrs() attribute.Set {
	return telemetry.ConsumedAttrs(k.handler, k.dest, k.system, k.outcome, k.class, k.errorType)
}

func annotate(span trace.Span, r *sluice.Report) {
	attrs := []attribute.KeyValue{telemetry.AttrOutcome.String(string(r.Outcome))}
	if r.Class.Valid() {
		attrs = append(attrs, telemetry.AttrClass.String(r.Class.String()))
		if r.Outcome == sluice.OutcomeFailed || r.Outcome == sluice.OutcomePoisoned {
			attrs = append(attrs, semconv.ErrorTypeKey.String(r.Class.String()))
		}
	}
	if r.Tier != "" {
		attrs = append(attrs, telemetry.AttrTier.String(r.Tier))
	}
	if r.Outcome == sluice.OutcomeRetried && r.Attempt > 0 {
		attrs = append(attrs, telemetry.AttrNextAttempt.Int(r.Attempt))
	}
	if r.Reason != "" {
		attrs = append(attrs, telemetry.AttrReason.String(r.Reason))
	}
	span.SetAttributes(attrs...)
	if r.Panic {
		span.AddEvent("panic")
		span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(
			semconv.ExceptionType("panic"), semconv.ExceptionStacktrace(r.Stack)))
	}
	if r.Outcome != sluice.OutcomeProcessed && r.Outcome != sluice.OutcomeFailed {
		span.AddEvent(string(r.Outcome), trace.WithAttributes(attrs...))
	}
}

// previousSpan parses sluice.PreviousTraceparentKey.
func previousSpan(msg *message.Message) trace.SpanContext {
	return telemetry.ParseTraceparent(msg.Metadata.Get(sluice.PreviousTraceparentKey))
}

// TracingPublisher wraps pub: each message gets a producer span, parented by
// its context, whose trace context is written into its metadata before it is
// published, so the consumer's Trace stage continues the trace.
func TracingPublisher(pub message.Publisher, cfg TraceConfig) message.Publisher {
	cfg = cfg.withDefaults()
	return &tracingPublisher{pub: pub, cfg: cfg, tracer: telemetry.Tracer(cfg.TracerProvider)}
}

type tracingPublisher struct {
	pub    message.Publisher
	cfg    TraceConfig
	tracer trace.Tracer
}

func (p *tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	spans := make([]trace.Span, len(msgs))
	for i, msg := range msgs {
		attrs := []attribute.KeyValue{
			semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(topic), semconv.MessagingMessageID(msg.UUID),
		}
		if p.cfg.System != "" {
			attrs = append(attrs, semconv.MessagingSystemKey.String(p.cfg.System))
		}
		if id := msg.Metadata.Get(sluice.EventIDKey); id != "" {
			attrs = append(attrs, telemetry.AttrEventID.String(id))
		}
		ctx, span := p.tracer.Start(msg.Context(), "send "+topic, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		p.cfg.Propagator.Inject(ctx, propagation.MapCarrier(msg.Metadata))
		spans[i] = span
	}
	err := p.pub.Publish(topic, msgs...)
	for _, span := range spans {
		if err != nil {
			telemetry.RecordError(span, err)
			span.SetStatus(codes.Error, diag.Summary(err, 256))
		}
		span.End()
	}
	return err
}

func (p *tracingPublisher) Close() error { return p.pub.Close() }
