package stage_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/stage"
)

// Classify gives every handler error its class; a rejection becomes an ack.
func ExampleClassify() {
	classify, err := stage.Classify(stage.ClassifyConfig{})
	if err != nil {
		panic(err)
	}
	for _, handlerErr := range []error{
		sluice.Reject(errors.New("out of stock")),
		fmt.Errorf("stock service: %w", context.DeadlineExceeded),
		errors.New("something unexpected"),
	} {
		h := classify(func(*message.Message) ([]*message.Message, error) { return nil, handlerErr })
		_, err := h(message.NewMessage("1", nil))
		fmt.Printf("%-34q → class %s, error %v\n", handlerErr.Error(), sluice.ClassOf(err), err)
	}
	// Output:
	// "rejected: out of stock"           → class unclassified, error <nil>
	// "stock service: context deadline exceeded" → class transient, error transient: stock service: context deadline exceeded
	// "something unexpected"             → class transient, error transient: something unexpected
}

// Recoverer turns a panic into an Invariant failure that carries the stack.
func ExampleRecoverer() {
	recoverer, err := stage.Recoverer(stage.RecovererConfig{})
	if err != nil {
		panic(err)
	}
	h := recoverer(func(*message.Message) ([]*message.Message, error) { panic("order o-1 has no lines") })
	_, err = h(message.NewMessage("1", nil))
	var p *sluice.PanicError
	fmt.Println(err)
	fmt.Println("class:", sluice.ClassOf(err), "stack captured:", errors.As(err, &p) && len(p.Stack) > 0)
	// Output:
	// invariant: panic: order o-1 has no lines
	// class: invariant stack captured: true
}

// Trace starts one consumer span per delivery and records its outcome.
func ExampleTrace() {
	spans := tracetest.NewSpanRecorder()
	trace, err := stage.Trace(stage.TraceConfig{
		Env:    sluice.Env{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)), MeterProvider: sdkmetric.NewMeterProvider()},
		System: "rabbitmq",
	})
	if err != nil {
		panic(err)
	}
	msg := message.NewMessage("1", nil)
	msg.Metadata.Set(sluice.EventIDKey, "evt-1")
	msg.SetContext(context.Background())
	_, _ = trace(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	for _, s := range spans.Ended() {
		fmt.Println(s.Name(), s.SpanKind())
		for _, a := range s.Attributes() {
			if a.Key == "sluice.outcome" || a.Key == "sluice.event_id" || a.Key == "messaging.system" {
				fmt.Printf("  %s=%s\n", a.Key, a.Value.String())
			}
		}
	}
	// Output:
	// process  consumer
	//   messaging.system=rabbitmq
	//   sluice.event_id=evt-1
	//   sluice.outcome=processed
}

// ShutdownGrace lets a handler finish its commit after the router's context
// is cancelled.
func ExampleShutdownGrace() {
	grace, err := stage.ShutdownGrace(time.Second)
	if err != nil {
		panic(err)
	}
	routerCtx, closeRouter := context.WithCancel(context.Background())
	msg := message.NewMessage("1", nil)
	msg.SetContext(routerCtx)
	_, err = grace(func(m *message.Message) ([]*message.Message, error) {
		closeRouter() // the router begins to close while the handler works
		time.Sleep(10 * time.Millisecond)
		return nil, m.Context().Err() // still live: the commit goes through
	})(msg)
	fmt.Println("handler error:", err)
	// Output:
	// handler error: <nil>
}
