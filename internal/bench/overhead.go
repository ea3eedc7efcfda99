package bench

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
)

// discard is a publisher that stores nothing (no copies are published in
// the healthy path measured).
type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

// StackHandler returns a trivial handler wrapped in the whole stack —
// ShutdownGrace, Trace (no-op tracer and meter), Poison, Retry, Classify,
// Inbox (memory store), Recoverer — or bare.
func StackHandler(bare bool) (message.HandlerFunc, error) {
	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	if bare {
		return h, nil
	}
	meter := noop.NewMeterProvider()
	tiers, err := retrytiers.Ladder("q")
	if err != nil {
		return nil, err
	}
	mws, err := router.Middlewares(router.Stages{
		Trace:     &middleware.TraceConfig{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: meter},
		Poison:    &poison.Config{Publisher: discard{}, Topic: "q.poison", MeterProvider: meter},
		Retry:     &retrytiers.Config{Publisher: discard{}, Tiers: tiers, MeterProvider: meter},
		Classify:  &middleware.ClassifyConfig{MeterProvider: meter},
		Inbox:     &deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c", MeterProvider: meter},
		Recoverer: &middleware.RecovererConfig{},
	})
	if err != nil {
		return nil, err
	}
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h, nil
}

// BenchmarkDelivery handles b.N messages, each with its own event id, through
// h; the message is built outside the timer's concern only as far as a
// consumer builds one per delivery too.
func BenchmarkDelivery(b *testing.B, h message.HandlerFunc) {
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		msg := message.NewMessage("uuid", nil)
		msg.Metadata.Set(middleware.EventIDKey, strconv.Itoa(i))
		msg.SetContext(ctx)
		if _, err := h(msg); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// Overhead prints P5: the stack's in-process cost per message over a bare
// handler, from testing.Benchmark in this process.
func Overhead(_ context.Context, o Options) error {
	var rows [][]string
	res := map[bool]testing.BenchmarkResult{}
	for _, bare := range []bool{true, false} {
		h, err := StackHandler(bare)
		if err != nil {
			return err
		}
		res[bare] = testing.Benchmark(func(b *testing.B) { BenchmarkDelivery(b, h) })
	}
	for _, bare := range []bool{true, false} {
		name := map[bool]string{true: "bare handler", false: "whole stack, no I/O"}[bare]
		r := res[bare]
		rows = append(rows, []string{name, strconv.FormatInt(r.NsPerOp(), 10), strconv.FormatInt(r.AllocsPerOp(), 10), strconv.FormatInt(r.AllocedBytesPerOp(), 10)})
	}
	fmt.Fprintln(o.Out, "P5: in-process overhead of the stack (ShutdownGrace, Trace with no-op providers, Poison, Retry, Classify, memory Inbox, Recoverer)")
	fmt.Fprintln(o.Out)
	Table(o.Out, []string{"", "ns/msg", "allocs/msg", "bytes/msg"}, rows)
	d := res[false].NsPerOp() - res[true].NsPerOp()
	a := res[false].AllocsPerOp() - res[true].AllocsPerOp()
	fmt.Fprintf(o.Out, "stack overhead: %d ns and %d allocs per message (targets ≤ 2000 ns, ≤ 25 allocs)\n", d, a)
	return nil
}
