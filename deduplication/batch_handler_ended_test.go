package deduplication_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/unitofwork"
)

// A delivery whose context ends while its batch waits to start — closed
// (full), the one slot taken by the batch before it — leaves the batch as
// it starts: the rest run without it, on a live context, and commit. Before,
// the batch ran with it, and the handler's context, which ends with its
// first delivery's, had ended: every delivery of the batch failed
// (Transient) and spent a retry. (A batch closes early more often since
// BatchHandler.InFlight: once every delivery in flight is in it.)
func TestADeliveryWhoseContextEndedWhileItsBatchWaitedLeavesIt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		type call struct {
			ids    []string
			ctxErr error
		}
		calls := make(chan call, 4)
		hold := make(chan struct{})
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c"},
			deduplication.BatchHandler{MaxBatch: 2, MaxWait: time.Second, Concurrency: 1,
				Handle: func(ctx context.Context, msgs []*message.Message) []error {
					c := call{ctxErr: ctx.Err()}
					for _, m := range msgs {
						c.ids = append(c.ids, m.UUID)
					}
					calls <- c
					if c.ids[0] == "a1" {
						<-hold // batch A holds the one slot
					}
					return nil
				}})
		require.NoError(t, err)
		deliver := func(ctx context.Context, id string) <-chan error { return deliverTo(ctx, h, id) }
		a1 := deliver(context.Background(), "a1")
		synctest.Wait()
		a2 := deliver(context.Background(), "a2")
		synctest.Wait() // A is full and runs, its handler held
		select {
		case e := <-a1:
			t.Fatalf("a1 returned %v", e)
		case c := <-calls:
			require.Equal(t, []string{"a1", "a2"}, c.ids)
		}

		b1ctx, cancel := context.WithCancel(context.Background())
		b1 := deliver(b1ctx, "b1")
		synctest.Wait()
		b2 := deliver(context.Background(), "b2")
		synctest.Wait() // B is full, closed, waiting for the slot
		cancel()        // b1's deadline, say (Watermill's Timeout)
		synctest.Wait()
		close(hold)

		require.NoError(t, <-a1)
		require.NoError(t, <-a2)
		got := <-calls
		require.Equal(t, []string{"b2"}, got.ids, "b1 left the batch as it started")
		require.NoError(t, got.ctxErr, "the batch's handler context is live")
		require.NoError(t, <-b2, "b2 committed")
		err = <-b1
		require.Error(t, err)
		require.True(t, errors.Is(err, context.Canceled), "b1 back unprocessed with its context's cause: %v", err)
		var f *sluice.Failure
		require.True(t, errors.As(err, &f) && f.Class == sluice.ClassTransient, "Transient: %v", err)
	})
}

// oneClaimStore is a store whose unit of work takes one Claim, as
// unitofwork.Tx allows (the Redis inbox, a store of a user's own): the
// MemoryStore's units of work, without ClaimBatch.
type oneClaimStore struct{ *deduplication.MemoryStore }

type oneClaimTx struct{ unitofwork.Tx }

func (s oneClaimStore) Begin(ctx context.Context) (unitofwork.Tx, error) {
	tx, err := s.MemoryStore.Begin(ctx)
	return oneClaimTx{tx}, err
}

// A batch handler runs a batch of many deliveries on the MemoryStore (its
// units of work claim many keys) in one call, and on a store whose units of
// work take one Claim each event in a unit of work of its own — every
// delivery done, once. Before, a batch of two or more claimed every key in
// one unit of work with one Claim after another, which the MemoryStore, the
// Redis inbox and unitofwork.Tx's contract refuse: every delivery of the
// batch failed ("Claim called twice", Transient), batch after batch.
func TestABatchHandlerRunsABatchOfManyOnEveryStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		store deduplication.Store
		calls []int // the events of each call of Handle
	}{
		{"the memory store", deduplication.NewMemoryStore(), []int{4}},
		{"a store whose unit of work takes one claim", oneClaimStore{deduplication.NewMemoryStore()}, []int{1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					mu    sync.Mutex
					sizes []int
				)
				h, err := deduplication.NewBatchHandler(deduplication.Config{Store: tc.store, Consumer: "c"},
					deduplication.BatchHandler{MaxBatch: 4, InFlight: 4, MaxWait: time.Second,
						Handle: func(_ context.Context, msgs []*message.Message) []error {
							mu.Lock()
							sizes = append(sizes, len(msgs)) // events alone run side by side
							mu.Unlock()
							return nil
						}})
				require.NoError(t, err)
				// deliverAll delivers evt-0…evt-3 side by side; each ends well.
				deliverAll := func(round string) {
					results := make(chan error, 4)
					for i := range 4 {
						msg := message.NewMessage(fmt.Sprint(round, i), nil)
						msg.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
						go func() { _, err := h(msg); results <- err }()
					}
					for range 4 {
						require.NoError(t, <-results)
					}
				}
				deliverAll("m")
				require.Equal(t, tc.calls, sizes)
				deliverAll("again") // every one a duplicate, the handler not called
				require.Equal(t, tc.calls, sizes, "duplicates: no call")
			})
		})
	}
}

// On a store whose unit of work takes one claim, a batch's first event runs
// in the unit of work the batch began and each other alone after it: one
// whose context ended while it waited for that goes back unprocessed, the
// store asked nothing for it, its event not handled. Before, it ran alone
// on a context that had ended (its handler called, its claim taken and
// committed after its deadline or its shutdown grace).
func TestAnEventOfAOneClaimStoreWhoseContextEndedBeforeItRanAloneIsNotRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		calls := make(chan string, 4)
		hold := make(chan struct{})
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: oneClaimStore{deduplication.NewMemoryStore()}, Consumer: "c"},
			deduplication.BatchHandler{MaxBatch: 2, InFlight: 2, MaxWait: time.Second,
				Handle: func(_ context.Context, msgs []*message.Message) []error {
					require.Len(t, msgs, 1, "one event a unit of work")
					calls <- msgs[0].UUID
					if msgs[0].UUID == "a1" {
						<-hold
					}
					return nil
				}})
		require.NoError(t, err)
		deliver := func(ctx context.Context, id string) <-chan error { return deliverTo(ctx, h, id) }
		a1 := deliver(context.Background(), "a1")
		synctest.Wait()
		a2ctx, cancel := context.WithCancel(context.Background())
		a2 := deliver(a2ctx, "a2")
		synctest.Wait() // the batch [a1 a2] runs a1, held; a2 waits to run alone
		require.Equal(t, "a1", <-calls)
		cancel() // a2's deadline, say (Watermill's Timeout)
		synctest.Wait()
		close(hold)
		require.NoError(t, <-a1)
		err = <-a2
		require.ErrorIs(t, err, context.Canceled, "a2 back unprocessed with its context's cause")
		var f *sluice.Failure
		require.True(t, errors.As(err, &f) && f.Class == sluice.ClassTransient, "Transient: %v", err)
		synctest.Wait()
		select {
		case id := <-calls:
			t.Fatalf("%s handled after its context ended", id)
		default:
		}
	})
}

// Concurrency bounds the units of work of a store whose unit of work takes
// one claim as it bounds batches: the events a batch runs alone wait for a
// slot. Before, each ran at once beside the others: with Concurrency 1, 8
// handlers at once — a pool sized to Concurrency, as the docs advise,
// could not give them a connection.
func TestConcurrencyBoundsTheEventsOfAOneClaimStore(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		handle, peak := peakOfHandlers()
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: oneClaimStore{deduplication.NewMemoryStore()}, Consumer: "c"},
			deduplication.BatchHandler{MaxBatch: 8, InFlight: 8, MaxWait: time.Second, Concurrency: 1,
				Handle: handle})
		require.NoError(t, err)
		results := make(chan error, 8)
		for i := range 8 {
			msg := message.NewMessage(fmt.Sprint("m", i), nil)
			msg.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
			go func() { _, err := h(msg); results <- err }()
		}
		for range 8 {
			require.NoError(t, <-results)
		}
		require.Equal(t, 1, peak(), "one unit of work at a time")
	})
}

// deliverTo hands h, on a goroutine, the delivery id (event evt-id) on ctx;
// what h returned comes on the channel.
func deliverTo(ctx context.Context, h message.HandlerFunc, id string) <-chan error {
	msg := message.NewMessage(id, nil)
	msg.Metadata.Set(sluice.EventIDKey, "evt-"+id)
	msg.SetContext(ctx)
	out := make(chan error, 1)
	go func() { _, err := h(msg); out <- err }()
	return out
}

// hungStore is a store whose unit of work takes one claim and whose claims
// do not answer until release is closed: a store black-holed mid-batch.
type hungStore struct {
	*deduplication.MemoryStore
	begins  atomic.Int64
	release chan struct{}
}

type hungTx struct {
	unitofwork.Tx
	release <-chan struct{}
}

func (s *hungStore) Begin(ctx context.Context) (unitofwork.Tx, error) {
	s.begins.Add(1)
	tx, err := s.MemoryStore.Begin(ctx)
	return hungTx{tx, s.release}, err
}

func (t hungTx) Claim(context.Context, string, string) (bool, error) {
	<-t.release
	return false, errors.New("the store answered at last")
}

// A batch handler on a store that stops answering mid-batch (its unit of
// work takes one claim, as the Redis inbox's), Concurrency 1, 8 deliveries
// in flight: the batch that met the outage fails after its bound, and every
// batch and event that waited for the slot meanwhile fails with that error
// at once (a dependency's, for the brake), the store asked nothing more —
// as a Handler's deliveries in flight would each fail in that outage.
// Before, each ran in turn, a slot at a time, and waited out its own bound:
// the last after 8 bounds (on a black-holed Redis, 30 s where the bound is
// 15).
func TestAOneClaimStoreThatDoesNotAnswerFailsTheBatchAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := &hungStore{MemoryStore: deduplication.NewMemoryStore(), release: make(chan struct{})}
		defer close(store.release)
		h, err := deduplication.NewBatchHandler(
			deduplication.Config{Store: store, Consumer: "c", Env: sluice.Env{StoreTimeout: time.Second}, ClaimTimeout: time.Second},
			deduplication.BatchHandler{MaxBatch: 8, InFlight: 8, MaxWait: time.Second, Concurrency: 1,
				Handle: func(context.Context, []*message.Message) []error { return nil }})
		require.NoError(t, err)
		start := time.Now()
		results := make([]<-chan error, 8)
		for i := range results {
			results[i] = deliverTo(context.Background(), h, fmt.Sprint("m", i))
		}
		for i, r := range results {
			err := <-r
			var dep *sluice.DependencyError
			require.ErrorAs(t, err, &dep, "delivery %d: the store's failure, for the brake", i)
		}
		require.EqualValues(t, 1, store.begins.Load(), "the store asked once, for the batch")
		require.Less(t, time.Since(start), 3*time.Second, "one bound (the virtual clock), not one each")
	})
}

// peakOfHandlers is a batch handler that sleeps a millisecond (on synctest's
// virtual clock: the others go on meanwhile) and the most of its calls that
// ran at once.
func peakOfHandlers() (func(context.Context, []*message.Message) []error, func() int) {
	var (
		mu            sync.Mutex
		running, peak int
	)
	return func(context.Context, []*message.Message) []error {
			mu.Lock()
			running++
			peak = max(peak, running)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			running--
			mu.Unlock()
			return nil
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return peak
		}
}
