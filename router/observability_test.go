package router_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// logLine is one line a capturing logger received.
type logLine struct {
	level, msg string
	err        error
	fields     watermill.LogFields
}

// capture is a watermill.LoggerAdapter that keeps every line.
type capture struct {
	mu    sync.Mutex
	lines []logLine
	with  watermill.LogFields
	root  *capture
}

func (c *capture) add(level, msg string, err error, f watermill.LogFields) {
	r := c.root
	if r == nil {
		r = c
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, logLine{level, msg, err, c.with.Add(f)})
}
func (c *capture) Error(msg string, err error, f watermill.LogFields) { c.add("error", msg, err, f) }
func (c *capture) Info(msg string, f watermill.LogFields)             { c.add("info", msg, nil, f) }
func (c *capture) Debug(msg string, f watermill.LogFields)            { c.add("debug", msg, nil, f) }
func (c *capture) Trace(msg string, f watermill.LogFields)            { c.add("trace", msg, nil, f) }
func (c *capture) With(f watermill.LogFields) watermill.LoggerAdapter {
	r := c.root
	if r == nil {
		r = c
	}
	return &capture{with: c.with.Add(f), root: r}
}

// all returns every line so far (a router goroutine may still write).
func (c *capture) all() []logLine {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.lines)
}

// about returns the lines that name the event id.
func (c *capture) about(id string) []logLine {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []logLine
	for _, l := range c.lines {
		if l.fields["event_id"] == id {
			out = append(out, l)
		}
	}
	return out
}

// The example stack with a capturing logger behind the router: one line per
// fate with the handler, event id, class, tier/attempt and reason; the
// panic's whole stack in the log, on the span and (bounded) in the poison
// copy; never the payload, never a password.
func TestEveryFateIsLoggedOnce(t *testing.T) {
	t.Parallel()
	logs := &capture{}
	spans := tracetest.NewSpanRecorder()
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{20 * time.Millisecond, 40 * time.Millisecond}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logs)
	require.NoError(t, err)
	var mu sync.Mutex
	seen := map[string]int{}
	_, err = router.Add(r, router.HandlerConfig{
		Broker: e,
		Name:   "inventory",
		Handler: func(msg *message.Message) error {
			id := msg.Metadata.Get(sluice.EventIDKey)
			mu.Lock()
			seen[id]++
			n := seen[id]
			mu.Unlock()
			switch id {
			case "evt-retry":
				if n == 1 {
					return sluice.Transient(errors.New("stock service: timeout"))
				}
			case "evt-exhausted":
				return errors.New("dial postgres://app:TopSecret1@db/orders: connection refused")
			case "evt-panic":
				panic("order o-1 has no lines")
			case "evt-rejected":
				return sluice.Reject(errors.New("out of stock"))
			}
			return nil
		},
		Stages: router.Stages{
			Env:       sluice.Env{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)), MeterProvider: sdkmetric.NewMeterProvider()},
			Trace:     &stage.TraceConfig{},
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "inventory"},
			Recoverer: &stage.RecovererConfig{},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	for _, id := range []string{"evt-retry", "evt-exhausted", "evt-panic", "evt-rejected", "evt-ok", "evt-ok"} {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{"card":"SECRET-PAYLOAD"}`))
		m.Metadata.Set(sluice.EventIDKey, id)
		require.NoError(t, e.PubSub().Publish("orders", m))
	}
	require.Eventually(t, func() bool { return len(e.Poisoned()) == 2 && len(logs.about("evt-retry")) >= 1 },
		time.Minute, 10*time.Millisecond)
	require.NoError(t, r.Close()) // every handler has returned: a second line, if one were written, shows now
	require.NoError(t, <-done)
	require.NoError(t, e.Close())

	fate := func(id string) []logLine {
		var out []logLine
		for _, l := range logs.about(id) {
			if l.level != "trace" && !strings.Contains(l.msg, "Message") { // Watermill's own lines aside
				out = append(out, l)
			}
		}
		return out
	}
	retry := fate("evt-retry")
	require.Len(t, retry, 1, "%v", retry)
	require.Equal(t, "Delivery parked in a retry tier", retry[0].msg)
	require.Equal(t, "inventory", retry[0].fields["handler"], "the handler's name, not the instance")
	require.Equal(t, "transient", retry[0].fields["class"])
	require.Equal(t, "20ms", retry[0].fields["tier"])
	require.Equal(t, 1, retry[0].fields["attempt"])
	require.Contains(t, retry[0].fields["reason"], "stock service: timeout")

	exhausted := fate("evt-exhausted")
	require.Len(t, exhausted, 4, "two retries, the budget spent, the poisoning: %v", exhausted)
	require.Equal(t, "Retry budget spent: the delivery is exhausted", exhausted[2].msg)
	require.Equal(t, "Delivery isolated in the poison queue", exhausted[3].msg)
	require.Equal(t, "exhausted", exhausted[3].fields["class"])
	require.Equal(t, "error", exhausted[3].level)

	p := fate("evt-panic")
	require.Len(t, p, 1)
	require.Equal(t, "invariant", p[0].fields["class"])
	require.Contains(t, p[0].fields["stack"], "runtime/debug.Stack", "the whole stack in the log")
	require.Contains(t, p[0].fields["stack"], "observability_test.go")

	rejected := fate("evt-rejected")
	require.Len(t, rejected, 1)
	require.Equal(t, "rejected", rejected[0].fields["class"])
	require.Contains(t, rejected[0].fields["reason"], "out of stock")

	dup := fate("evt-ok")
	require.Len(t, dup, 1, "the duplicate, at debug")
	require.Equal(t, "debug", dup[0].level)

	for _, l := range logs.all() {
		text := fmt.Sprint(l.msg, l.err, l.fields)
		require.NotContains(t, text, "SECRET-PAYLOAD", "no payload in a log line")
		require.NotContains(t, text, "TopSecret1", "no password in a log line")
	}

	var panicCopy *message.Message
	for _, m := range e.Poisoned() {
		if m.Metadata.Get(sluice.EventIDKey) == "evt-panic" {
			panicCopy = m
		}
	}
	require.NotNil(t, panicCopy)
	require.Contains(t, panicCopy.Metadata.Get(metakeys.PoisonStack), "runtime/debug.Stack", "the stack in the poison copy")
	require.LessOrEqual(t, len(panicCopy.Metadata.Get(metakeys.PoisonStack)), 8<<10, "sluice_poison_stack is cut to 8 KiB")

	var stackOnSpan, poisonedError bool
	for _, s := range spans.Ended() {
		for _, ev := range s.Events() {
			for _, a := range ev.Attributes {
				if a.Key == "exception.stacktrace" && strings.Contains(a.Value.AsString(), "runtime/debug.Stack") {
					stackOnSpan = true
				}
			}
		}
		if attr(s, "sluice.outcome") == "poisoned" {
			poisonedError = s.Status().Code == 1 /* codes.Error */ && attr(s, "error.type") != ""
		}
	}
	require.True(t, stackOnSpan, "the stack on the span as exception.stacktrace")
	require.True(t, poisonedError, "a poisoned delivery's span is an error with error.type")
}

// Competing consumers are one handler in metrics and logs: the name given to
// Add, not "inventory-0", "inventory-1"; spans keep the instance apart.
func TestCompetingConsumersShareTheHandlerName(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Name: "billing", Topic: "invoices", Subscriber: pubSub, Consumers: 2,
		Handler: func(*message.Message) error { return nil },
		Stages: router.Stages{
			Env:   sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))},
			Trace: &stage.TraceConfig{},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	require.NoError(t, pubSub.Publish("invoices", message.NewMessage(watermill.NewUUID(), nil)))
	require.Eventually(t, func() bool { return len(spans.Ended()) == 2 }, time.Minute, 5*time.Millisecond, "GoChannel gives both consumers the message")
	require.NoError(t, r.Close())
	require.NoError(t, <-done)

	handlers := testenv.AttributeValues(t, reader, telemetry.MetricConsumed, "messaging.consumer.group.name")
	require.Equal(t, []string{"billing"}, handlers)
	instances := map[string]bool{}
	for _, s := range spans.Ended() {
		require.Equal(t, "billing", attr(s, "messaging.consumer.group.name"))
		instances[attr(s, "sluice.handler.instance")] = true
	}
	require.Equal(t, map[string]bool{"billing-0": true, "billing-1": true}, instances)
}
