package bench

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// discard is a publisher that stores nothing (no copies are published in
// the healthy path measured).
type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

// StackHandler returns a trivial handler wrapped in the whole stack —
// ShutdownGrace, Trace (no-op tracer and meter), Poison, Retry, Classify,
// Inbox (the returned memory store), Recoverer — or bare (store nil).
func StackHandler(bare bool) (message.HandlerFunc, *deduplication.MemoryStore, error) {
	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	if bare {
		return h, nil, nil
	}
	store := deduplication.NewMemoryStore()
	meter := noop.NewMeterProvider()
	tiers, err := broker.Ladder("q")
	if err != nil {
		return nil, nil, err
	}
	mws, err := router.Middlewares(router.Stages{
		Trace:     &stage.TraceConfig{Env: sluice.Env{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: meter}},
		Poison:    &poison.Config{Publisher: discard{}, Topic: "q.poison", Env: sluice.Env{MeterProvider: meter}},
		Retry:     &retrytiers.Config{Publisher: discard{}, Tiers: tiers, Env: sluice.Env{MeterProvider: meter}},
		Classify:  &stage.ClassifyConfig{Env: sluice.Env{MeterProvider: meter}},
		Inbox:     &deduplication.Config{Store: store, Consumer: "c", Env: sluice.Env{MeterProvider: meter}},
		Recoverer: &stage.RecovererConfig{},
	})
	if err != nil {
		return nil, nil, err
	}
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h, store, nil
}

// BenchmarkDelivery handles b.N messages through h, each with its own event
// id and, as watermill-amqp gives every delivery, a cancellable context. The
// message is built in the loop for both variants, as a subscriber builds one
// per delivery. The memory inbox (if any) is emptied every 10,000 messages,
// outside the timer: what is measured is the stack, not a map of millions
// of keys that no real store would hold in memory.
func BenchmarkDelivery(b *testing.B, h message.HandlerFunc, store *deduplication.MemoryStore) {
	base := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if store != nil && i%10_000 == 9_999 {
			b.StopTimer()
			_, _ = store.DeleteBefore(base, time.Now().Add(time.Hour), 1<<30)
			b.StartTimer()
		}
		ctx, cancel := context.WithCancel(base)
		msg := message.NewMessage("uuid", nil)
		msg.Metadata.Set(sluice.EventIDKey, strconv.Itoa(i))
		msg.SetContext(ctx)
		if _, err := h(msg); err != nil {
			b.Fatal(err)
		}
		cancel()
		i++
	}
}

// Overhead prints P5: the stack's in-process cost per message over a bare
// handler, from testing.Benchmark in this process.
func Overhead(_ context.Context, o Options) error {
	var rows [][]string
	res := map[bool]testing.BenchmarkResult{}
	for _, bare := range []bool{true, false} {
		h, store, err := StackHandler(bare)
		if err != nil {
			return err
		}
		res[bare] = testing.Benchmark(func(b *testing.B) { BenchmarkDelivery(b, h, store) })
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
