package bench

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// go test -bench Overhead -benchmem ./internal/bench/
func BenchmarkOverhead(b *testing.B) {
	for _, bare := range []bool{true, false} {
		h, store, err := StackHandler(bare)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(map[bool]string{true: "bare", false: "stack"}[bare], func(b *testing.B) { BenchmarkDelivery(b, h, store) })
	}
}

// BenchmarkOverheadByStage measures stages alone, for the breakdown in
// docs/benchmarks.md: go test -run '^$' -bench OverheadByStage -benchmem ./internal/bench/
func BenchmarkOverheadByStage(b *testing.B) {
	meter := noop.NewMeterProvider()
	for _, c := range []struct {
		name   string
		stages func(*deduplication.MemoryStore) router.Stages
	}{
		{"shutdown-grace", func(*deduplication.MemoryStore) router.Stages { return router.Stages{} }},
		{"shutdown-grace+trace", func(*deduplication.MemoryStore) router.Stages {
			return router.Stages{Trace: &stage.TraceConfig{Env: sluice.Env{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: meter}}}
		}},
		{"inbox", func(st *deduplication.MemoryStore) router.Stages {
			return router.Stages{ShutdownGrace: -1, Inbox: &deduplication.Config{Store: st, Consumer: "c", Env: sluice.Env{MeterProvider: meter}}}
		}},
		// A store that is not the MemoryStore, as a SQL store: each call
		// bounded by StoreTimeout, the unit of work begun on a context
		// detached from the message's (no I/O: the memory store inside).
		{"inbox, another store", func(st *deduplication.MemoryStore) router.Stages {
			return router.Stages{ShutdownGrace: -1, Inbox: &deduplication.Config{Store: otherStore{st}, Consumer: "c", Env: sluice.Env{MeterProvider: meter}}}
		}},
	} {
		store := deduplication.NewMemoryStore()
		mws, err := router.Middlewares(c.stages(store))
		if err != nil {
			b.Fatal(err)
		}
		h := message.HandlerFunc(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		for i := len(mws) - 1; i >= 0; i-- {
			h = mws[i](h)
		}
		b.Run(c.name, func(b *testing.B) { BenchmarkDelivery(b, h, store) })
	}
}

// otherStore is the MemoryStore under another type: the inbox treats it as
// any store but its own MemoryStore.
type otherStore struct{ *deduplication.MemoryStore }
