package router_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// The order of the stages, seen from the outside: each line is the outcome
// the outermost stage (Trace) recorded for one delivery, and each holds only
// because the stages run Trace → Poison → Retry → Classify → Inbox →
// Recoverer → handler.
func Example_chain() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	embedded, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{20 * time.Millisecond}})
	if err != nil {
		panic(err)
	}
	store := deduplication.NewMemoryStore()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}

	var mu sync.Mutex
	attempts := map[string]int{}
	seen := func(id string) int { mu.Lock(); defer mu.Unlock(); return attempts[id] }
	_, err = router.Add(r, router.HandlerConfig{
		Broker: embedded,
		Name:   "inventory",
		Handler: func(msg *message.Message) error {
			id := msg.Metadata.Get(sluice.EventIDKey)
			mu.Lock()
			attempts[id]++
			n := attempts[id]
			mu.Unlock()
			switch id {
			case "out-of-stock": // Classify acks it; the Inbox inside commits it
				return sluice.Reject(errors.New("out of stock"))
			case "flaky": // Retry parks it once; it succeeds on attempt 2
				if n == 1 {
					return sluice.Transient(errors.New("timeout"))
				}
			case "down": // Retry's budget is spent; Poison outside isolates it
				return sluice.Transient(errors.New("timeout"))
			case "bug": // the Recoverer turns it into an error the Inbox rolls back on
				panic("nil map")
			case "malformed":
				return sluice.Poison(errors.New("missing sku"))
			}
			return nil
		},
		Stages: router.Stages{
			Trace:     &stage.TraceConfig{Env: sluice.Env{TracerProvider: tp}},
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: store, Consumer: "inventory"},
			Recoverer: &stage.RecovererConfig{},
		},
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()

	for _, id := range []string{"ok", "ok", "out-of-stock", "flaky", "down", "bug", "malformed"} {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, id)
		_ = embedded.PubSub().Publish("orders", m)
	}
	for len(embedded.Poisoned()) < 3 || seen("flaky") < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	_ = r.Close()
	_ = embedded.Close()

	var lines []string
	for _, s := range spans.Ended() {
		line := ""
		for _, a := range s.Attributes() {
			switch a.Key {
			case "sluice.event_id": // the attributes of docs/observability.md
				line = a.Value.AsString() + line
			case "sluice.attempt":
				line += fmt.Sprintf(" attempt %d:", a.Value.AsInt64())
			case "sluice.outcome", "sluice.class", "sluice.tier":
				line += " " + a.Value.AsString()
			}
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	fmt.Println("inbox records:", store.Len())
	// Output:
	// bug attempt 1: poisoned invariant
	// down attempt 1: retried transient 20ms
	// down attempt 2: poisoned exhausted
	// flaky attempt 1: retried transient 20ms
	// flaky attempt 2: processed
	// malformed attempt 1: poisoned poison
	// ok attempt 1: duplicate
	// ok attempt 1: processed
	// out-of-stock attempt 1: rejected rejected
	// inbox records: 3
}
