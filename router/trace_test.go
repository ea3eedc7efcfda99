package router_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

type traced struct {
	spans    *tracetest.SpanRecorder
	tp       *sdktrace.TracerProvider
	metrics  *sdkmetric.ManualReader
	embedded *embedded.Broker
	producer message.Publisher
}

// runTraced runs handler behind Trace → Poison → Retry → Classify on the
// embedded default until done says so.
func runTraced(t *testing.T, handler message.NoPublishHandlerFunc, stages func(*traced) router.Stages) *traced {
	t.Helper()
	tr := &traced{spans: tracetest.NewSpanRecorder(), metrics: sdkmetric.NewManualReader()}
	tr.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tr.spans))
	var err error
	tr.embedded, err = embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{10 * time.Millisecond}})
	require.NoError(t, err)
	cfg := stage.TraceConfig{Env: sluice.Env{TracerProvider: tr.tp, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(tr.metrics))}}
	tr.producer = stage.TracingPublisher(tr.embedded.PubSub(), cfg)
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	s := router.Stages{Trace: &cfg, Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{}}
	if stages != nil {
		s = stages(tr)
	}
	_, err = router.Add(r, router.HandlerConfig{Broker: tr.embedded, Name: "inventory", Handler: handler, Stages: s})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
		_ = tr.embedded.Close()
	})
	return tr
}

func (tr *traced) consumerSpans(n int) func() bool {
	return func() bool {
		c := 0
		for _, s := range tr.spans.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer {
				c++
			}
		}
		return c >= n
	}
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

func TestTraceParentLinkAndStatus(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	tr := runTraced(t, func(*message.Message) error {
		if n.Add(1) == 1 {
			return sluice.Transient(errors.New("timeout"))
		}
		return nil
	}, nil)

	// A producer span in a trace of the test's own.
	ctx, root := tr.tp.Tracer("test").Start(context.Background(), "place order")
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	m.SetContext(ctx)
	require.NoError(t, tr.producer.Publish("orders", m))
	root.End()
	require.Eventually(t, tr.consumerSpans(2), time.Minute, 5*time.Millisecond)

	var producer, first, second sdktrace.ReadOnlySpan
	for _, s := range tr.spans.Ended() {
		switch {
		case s.SpanKind() == trace.SpanKindProducer:
			producer = s
		case s.SpanKind() == trace.SpanKindConsumer && attr(s, "sluice.attempt") == "1":
			first = s
		case s.SpanKind() == trace.SpanKindConsumer && attr(s, "sluice.attempt") == "2":
			second = s
		}
	}
	require.NotNil(t, producer)
	require.Equal(t, "send orders", producer.Name())
	require.Equal(t, root.SpanContext().SpanID(), producer.Parent().SpanID())

	require.Equal(t, "process orders", first.Name())
	require.Equal(t, producer.SpanContext().SpanID(), first.Parent().SpanID(), "the consumer span is parented by the producer's")
	require.Equal(t, root.SpanContext().TraceID(), first.SpanContext().TraceID())
	require.Equal(t, "retried", attr(first, "sluice.outcome"))
	require.Equal(t, "10ms", attr(first, "sluice.tier"))
	require.Equal(t, "2", attr(first, "sluice.next_attempt"))
	require.Equal(t, "process", attr(first, "messaging.operation.type"))
	require.Equal(t, "orders", attr(first, "messaging.destination.name"))
	require.Equal(t, "inventory", attr(first, "messaging.consumer.group.name"))
	require.Equal(t, "gochannel", attr(first, "messaging.system"))
	require.Equal(t, "evt-1", attr(first, "sluice.event_id"))
	require.Equal(t, codes.Unset, first.Status().Code, "a retried delivery was handled: no error status")
	require.Equal(t, "retried", first.Events()[0].Name)

	require.Equal(t, root.SpanContext().TraceID(), second.SpanContext().TraceID(), "the retry stays in the producer's trace")
	require.Len(t, second.Links(), 1, "the retry links to the attempt that failed")
	require.Equal(t, first.SpanContext().SpanID(), second.Links()[0].SpanContext.SpanID())
	require.Equal(t, "processed", attr(second, "sluice.outcome"))

	var rm metricdata.ResourceMetrics
	require.NoError(t, tr.metrics.Collect(context.Background(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name == telemetry.MetricConsumed {
				for _, dp := range mt.Data.(metricdata.Sum[int64]).DataPoints {
					if o, _ := dp.Attributes.Value(telemetry.AttrOutcome); dp.Value != 0 { // not a series exported at zero
						got[o.AsString()] += dp.Value
					}
				}
			}
			if mt.Name == telemetry.MetricProcessDuration {
				require.NotEmpty(t, mt.Data.(metricdata.Histogram[float64]).DataPoints)
			}
		}
	}
	require.Equal(t, map[string]int64{"retried": 1, "processed": 1}, got)
}

func TestTraceErrorStatusOnlyWhenNacked(t *testing.T) {
	t.Parallel()
	errDown := errors.New("poison queue down: dial amqp://guest:TopSecret1@127.0.0.1:5672/")
	failing := &failingPublisher{err: errDown}
	tr := runTraced(t, func(msg *message.Message) error {
		if msg.Metadata.Get(sluice.EventIDKey) == "panics" {
			panic("boom")
		}
		return sluice.Poison(errors.New("malformed"))
	}, func(tr *traced) router.Stages {
		cfg := stage.TraceConfig{Env: sluice.Env{TracerProvider: tr.tp}}
		return router.Stages{Trace: &cfg, Poison: &poison.Config{Publisher: failing, Topic: "p", Env: sluice.Env{PublishBackoff: time.Millisecond}, DisablePark: true}, Classify: &stage.ClassifyConfig{}, Recoverer: &stage.RecovererConfig{}}
	})
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "malformed")
	require.NoError(t, tr.embedded.PubSub().Publish("orders", m))
	require.Eventually(t, tr.consumerSpans(1), time.Minute, 5*time.Millisecond)
	failing.set(nil) // the poison queue is back: the redelivery is isolated
	require.Eventually(t, func() bool {
		for _, s := range tr.spans.Ended() {
			if attr(s, "sluice.outcome") == "poisoned" {
				return true
			}
		}
		return false
	}, time.Minute, 5*time.Millisecond)
	s := tr.spans.Ended()[0]
	require.Equal(t, "failed", attr(s, "sluice.outcome"))
	require.Equal(t, codes.Error, s.Status().Code, "a failure that reached the router (nack) is an error")
	require.Contains(t, s.Status().Description, "poison queue down")
	require.NotContains(t, s.Status().Description, "TopSecret1")
	var exceptions int
	for _, e := range s.Events() {
		for _, a := range e.Attributes {
			require.NotContains(t, a.Value.String(), "TopSecret1", "event %s attribute %s", e.Name, a.Key)
		}
		if e.Name == "exception" {
			exceptions++
		}
	}
	require.Equal(t, 1, exceptions, "the error is recorded, redacted")

	p := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	p.Metadata.Set(sluice.EventIDKey, "panics")
	require.NoError(t, tr.embedded.PubSub().Publish("orders", p))
	require.Eventually(t, func() bool {
		for _, s := range tr.spans.Ended() {
			for _, e := range s.Events() {
				if e.Name == "panic" {
					return attr(s, "sluice.outcome") == "poisoned" && attr(s, "sluice.class") == "invariant"
				}
			}
		}
		return false
	}, time.Minute, 5*time.Millisecond, "a panic is an event on a poisoned span")
}

// failingPublisher fails while err is set: the fault of an unreachable
// poison queue.
type failingPublisher struct {
	mu  sync.Mutex
	err error
}

func (f *failingPublisher) set(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

func (f *failingPublisher) Publish(string, ...*message.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *failingPublisher) Close() error { return nil }

func TestTracingPublisherAsADecorator(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	decorate := message.PublisherDecorator(func(pub message.Publisher) (message.Publisher, error) {
		return stage.TracingPublisher(pub, stage.TraceConfig{Env: sluice.Env{TracerProvider: tp}}), nil
	})
	pub, err := decorate(pubSub)
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil)))
	out, err := pubSub.Subscribe(t.Context(), "t")
	require.NoError(t, err)
	m := <-out
	m.Ack()
	require.Len(t, spans.Ended(), 1)
	require.Equal(t, "send t", spans.Ended()[0].Name())
	require.Contains(t, m.Metadata.Get(sluice.TraceparentKey), spans.Ended()[0].SpanContext().TraceID().String(), "the trace context is in the metadata")
}
