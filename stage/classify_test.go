package stage_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/stage"
)

func newMsg() *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(`{}`))
}

var errBusiness = errors.New("order already shipped")

func jsonSyntaxErr() error {
	var v any
	return json.Unmarshal([]byte("{"), &v)
}

func TestClassify(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mw, err := stage.Classify(stage.ClassifyConfig{
		Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
	})
	require.NoError(t, err)

	out := message.NewMessage("rejection-event", nil)
	run := func(herr error) ([]*message.Message, error) {
		return mw(func(*message.Message) ([]*message.Message, error) {
			return []*message.Message{out}, herr
		})(newMsg())
	}

	produced, err := run(nil)
	require.NoError(t, err)
	require.Len(t, produced, 1)

	produced, err = run(sluice.Reject(errBusiness))
	require.NoError(t, err, "a rejection is acked")
	require.Equal(t, []*message.Message{out}, produced, "a rejection's produced messages are published")

	_, err = run(context.DeadlineExceeded)
	f, ok := errors.AsType[*sluice.Failure](err)
	require.True(t, ok, "every error becomes a *Failure: %v", err)
	require.Equal(t, sluice.ClassTransient, f.Class)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	explicit := sluice.Poison(errBusiness)
	_, err = run(explicit)
	require.Same(t, explicit, err, "a top-level Failure is returned as is")

	_, err = run(jsonSyntaxErr())
	require.Equal(t, sluice.ClassPoison, sluice.ClassOf(err))

	require.Equal(t, int64(1), testenv.CounterSum(t, reader, telemetry.MetricRejected))
}

func TestRecoverer(t *testing.T) {
	t.Parallel()
	mw, err := stage.Recoverer(stage.RecovererConfig{})
	require.NoError(t, err)

	_, err = mw(func(*message.Message) ([]*message.Message, error) { panic("nil map") })(newMsg())
	require.Equal(t, sluice.ClassInvariant, sluice.ClassOf(err))
	p, ok := errors.AsType[*sluice.PanicError](err)
	require.True(t, ok)
	require.Equal(t, "nil map", p.Value)
	require.Contains(t, string(p.Stack), "classify_test.go", "the stack points at the panic")
	require.Equal(t, "invariant: panic: nil map", err.Error())

	_, err = mw(func(*message.Message) ([]*message.Message, error) { panic(errBusiness) })(newMsg())
	require.ErrorIs(t, err, errBusiness, "a panic(err) unwraps to err")

	produced, err := mw(func(m *message.Message) ([]*message.Message, error) { return []*message.Message{m}, nil })(newMsg())
	require.NoError(t, err)
	require.Len(t, produced, 1)

	mw, err = stage.Recoverer(stage.RecovererConfig{Class: sluice.ClassTransient})
	require.NoError(t, err)
	_, err = mw(func(*message.Message) ([]*message.Message, error) { panic("flaky") })(newMsg())
	require.Equal(t, sluice.ClassTransient, sluice.ClassOf(err))

	_, err = stage.Recoverer(stage.RecovererConfig{Class: sluice.ClassRejected})
	require.ErrorContains(t, err, "RecovererConfig.Class")
}

// On RabbitMQ the consumer span names the routing key the delivery came
// with (the Marshaler's sluice_amqp_routing_key), and the instrumentation
// scope has a version.
func TestTraceRoutingKeyAndScope(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	trace, err := stage.Trace(stage.TraceConfig{
		Env:    sluice.Env{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)), MeterProvider: sdkmetric.NewMeterProvider()},
		System: "rabbitmq",
	})
	require.NoError(t, err)
	msg := message.NewMessage("1", nil)
	msg.Metadata.Set(metakeys.SourceRoutingKey, "orders.created.eu")
	msg.SetContext(t.Context())
	_, err = trace(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	require.NoError(t, err)
	require.Len(t, spans.Ended(), 1)
	s := spans.Ended()[0]
	var rk string
	for _, a := range s.Attributes() {
		if a.Key == "messaging.rabbitmq.destination.routing_key" {
			rk = a.Value.AsString()
		}
	}
	require.Equal(t, "orders.created.eu", rk)
	require.Equal(t, "github.com/sluicemq/sluice", s.InstrumentationScope().Name)
	require.NotEmpty(t, s.InstrumentationScope().Version)
}
