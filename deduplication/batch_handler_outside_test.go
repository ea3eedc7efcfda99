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

// A batch on the MemoryStore, whose unit of work holds the claims and not
// the handler's effects (deduplication.ClaimReleaser), is never run again:
// an event that fails leaves it by its claim's release — a redelivery runs
// it — while the others' effects, done once, are committed; a panic fails
// each event (it cannot tell which ran). Before, the batch was rolled back
// and run again without the failed event (by halves after a panic): each
// other event's effect, outside the unit of work, was done twice or more.
func TestABatchOnAStoreOutsideTheEffectsIsNeverRunAgain(t *testing.T) {
	t.Parallel()
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panic=%v", panics), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				store := deduplication.NewMemoryStore()
				var mu sync.Mutex
				effects := map[string]int{}
				h, err := deduplication.NewBatchHandler(deduplication.Config{Store: store, Consumer: "c"},
					deduplication.BatchHandler{MaxBatch: 8, MaxWait: time.Second, Concurrency: 1,
						Handle: func(_ context.Context, msgs []*message.Message) []error {
							mu.Lock()
							defer mu.Unlock()
							out := make([]error, len(msgs))
							for i, m := range msgs {
								id := m.Metadata.Get(sluice.EventIDKey)
								if id == "evt-7" {
									if panics {
										panic("evt-7")
									}
									out[i] = errors.New("evt-7 fails")
									continue
								}
								effects[id]++ // an effect outside the store: a file, a call
							}
							return out
						}})
				require.NoError(t, err)
				results := map[string]<-chan error{}
				for i := range 8 {
					results[fmt.Sprint("evt-", i)] = deliverTo(t.Context(), h, fmt.Sprint(i))
				}
				for id, res := range results {
					err := <-res
					switch {
					case panics:
						var pe *sluice.PanicError
						require.ErrorAs(t, err, &pe, "%s fails with the batch's panic", id)
						require.Equal(t, sluice.ClassInvariant, sluice.DefaultClassifier().Classify(err))
					case id == "evt-7":
						require.ErrorContains(t, err, "evt-7 fails")
					default:
						require.NoError(t, err, "%s done", id)
					}
				}
				for id, n := range effects {
					require.Equal(t, 1, n, "%s's effect done once", id)
				}
				if panics {
					return
				}
				require.Len(t, effects, 7)
				// The failed event's claim was released: its redelivery runs
				// (and fails again); the others' were committed: theirs are
				// duplicates.
				for i := range 8 {
					msg := message.NewMessage(fmt.Sprint("again-", i), nil)
					msg.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
					msg.SetContext(t.Context())
					_, err := h(msg)
					if i == 7 {
						require.ErrorContains(t, err, "evt-7 fails", "evt-7 runs again")
						continue
					}
					require.NoError(t, err, "evt-%d again: a duplicate", i)
				}
				require.Len(t, effects, 7, "no other event ran again")
				for id, n := range effects {
					require.Equal(t, 1, n, "%s's effect done once", id)
				}
			})
		})
	}
}

// A batch one of whose keys another unit of work holds runs its events
// alone in the handler's Concurrency slots: with Concurrency 1, one at a
// time. Before, they ran outside the slots, all at once (7 handlers at
// once on Redis; a pool sized to Concurrency could not serve them).
func TestTheEventsOfABatchWithAHeldKeyKeepToConcurrency(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := deduplication.NewMemoryStore()
		holder := holdKey(t, store, "evt-0")
		handle, peak := peakOfHandlers()
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: store, Consumer: "c", ClaimTimeout: time.Second},
			deduplication.BatchHandler{MaxBatch: 8, InFlight: 8, MaxWait: time.Second, Concurrency: 1,
				Handle: handle})
		require.NoError(t, err)
		var results []<-chan error
		for i := range 8 {
			results = append(results, deliverTo(t.Context(), h, fmt.Sprint(i)))
		}
		require.ErrorIs(t, <-results[0], deduplication.ErrClaimInProgress, "the held event waits its ClaimTimeout")
		for _, res := range results[1:] {
			require.NoError(t, <-res)
		}
		require.Equal(t, 1, peak(), "one unit of work at a time")
		require.NoError(t, holder.Rollback(t.Context()))
	})
}

// A panic in a batch on the MemoryStore fails a copy of one of its events
// in the same batch too: which of them ran cannot be told. Before, the
// copy found the key released and ran at once: an event both poisoned and
// done, its effect twice.
func TestACopyInABatchThatPanickedOnAStoreOutsideTheEffectsIsNotRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		effects := map[string]int{}
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c"},
			deduplication.BatchHandler{MaxBatch: 5, MaxWait: time.Second, Concurrency: 1,
				Handle: func(_ context.Context, msgs []*message.Message) []error {
					mu.Lock()
					defer mu.Unlock()
					for _, m := range msgs {
						id := m.Metadata.Get(sluice.EventIDKey)
						if id == "evt-3" {
							panic("evt-3")
						}
						effects[id]++
					}
					return nil
				}})
		require.NoError(t, err)
		var results []<-chan error
		for i := range 4 {
			results = append(results, deliverTo(t.Context(), h, fmt.Sprint(i)))
		}
		copyOf0 := message.NewMessage("copy-of-0", nil)
		copyOf0.Metadata.Set(sluice.EventIDKey, "evt-0")
		results = append(results, func() <-chan error {
			out := make(chan error, 1)
			go func() { _, err := h(copyOf0); out <- err }()
			return out
		}())
		for i, res := range results {
			var pe *sluice.PanicError
			require.ErrorAs(t, <-res, &pe, "delivery %d fails with the panic", i)
		}
		for id, n := range effects {
			require.Equal(t, 1, n, "%s's effect done once", id)
		}
	})
}

// releaseFails is a MemoryStore whose ReleaseClaims fails: a Redis that
// stops answering after the handler ran.
type releaseFails struct{ *deduplication.MemoryStore }

type releaseFailsTx struct {
	unitofwork.Tx
	bc deduplication.BatchClaimer
}

func (s releaseFails) Begin(ctx context.Context) (unitofwork.Tx, error) {
	tx, err := s.MemoryStore.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return releaseFailsTx{tx, tx.(deduplication.BatchClaimer)}, nil
}

func (t releaseFailsTx) ClaimBatch(ctx context.Context, consumer string, keys []string, wait, idle time.Duration) ([]string, error) {
	return t.bc.ClaimBatch(ctx, consumer, keys, wait, idle)
}

func (releaseFailsTx) ReleaseClaims(context.Context, string, []string) error {
	return errors.New("the store stopped answering")
}

// A batch whose failed event's claim cannot be released fails every other
// event Transient, and the failed one keeps its own error and class (its
// claim is rolled back). Before, every event got every event's error
// joined: a done event reported another's Poison error, and the Poison
// event, Transient, went to a retry tier instead of the poison queue.
func TestAFailedReleaseKeepsTheFailedEventsClass(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: releaseFails{deduplication.NewMemoryStore()}, Consumer: "c"},
			deduplication.BatchHandler{MaxBatch: 4, MaxWait: time.Second, Concurrency: 1,
				Handle: func(_ context.Context, msgs []*message.Message) []error {
					out := make([]error, len(msgs))
					for i, m := range msgs {
						if m.Metadata.Get(sluice.EventIDKey) == "evt-1" {
							out[i] = sluice.Poison(errors.New("evt-1 is malformed"))
						}
					}
					return out
				}})
		require.NoError(t, err)
		results := map[int]<-chan error{}
		for i := range 4 {
			results[i] = deliverTo(t.Context(), h, fmt.Sprint(i))
		}
		classifier := sluice.DefaultClassifier()
		for i, res := range results {
			err := <-res
			if i == 1 {
				require.Equal(t, sluice.ClassPoison, classifier.Classify(err), "evt-1 keeps its class: %v", err)
				continue
			}
			require.Equal(t, sluice.ClassTransient, classifier.Classify(err), "evt-%d: %v", i, err)
			require.ErrorContains(t, err, "the store stopped answering")
			require.NotContains(t, err.Error(), "malformed", "evt-%d does not carry evt-1's error", i)
		}
	})
}

// A burst of deliveries — every one the handler can be handed at once
// (InFlight), inside it before the first joins a batch — makes one batch.
// Before, a batch closed as soon as InFlight deliveries were inside the
// handler, joined or not: in a burst, at each join, batches of one.
func TestABurstOfInFlightDeliveriesMakesOneBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sizes []int
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c"},
			deduplication.BatchHandler{MaxBatch: 16, InFlight: 16, MaxWait: time.Second, Concurrency: 1,
				Handle: func(_ context.Context, msgs []*message.Message) []error {
					mu.Lock()
					defer mu.Unlock()
					sizes = append(sizes, len(msgs))
					return nil
				}})
		require.NoError(t, err)
		var results []<-chan error
		for i := range 16 {
			results = append(results, deliverTo(t.Context(), h, fmt.Sprint(i)))
		}
		for _, res := range results {
			require.NoError(t, <-res)
		}
		require.Equal(t, []int{16}, sizes, "one batch of the 16")
	})
}

// A panic of a batch of one event on the MemoryStore fails its copy in the
// batch too. Before, only a panic of two or more events did: the copy of a
// lone event found its key released and ran again — poisoned and done, its
// effect twice.
func TestACopyOfALoneEventThatPanickedOnAStoreOutsideTheEffectsIsNotRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var calls, effects atomic.Int32
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c"},
			deduplication.BatchHandler{MaxBatch: 2, MaxWait: time.Second, Concurrency: 1,
				Handle: func(context.Context, []*message.Message) []error {
					calls.Add(1)
					effects.Add(1)
					panic("after the effect")
				}})
		require.NoError(t, err)
		first := deliverTo(t.Context(), h, "0")
		second := deliverTo(t.Context(), h, "0")
		for _, res := range []<-chan error{first, second} {
			var pe *sluice.PanicError
			require.ErrorAs(t, <-res, &pe)
		}
		require.EqualValues(t, 1, calls.Load(), "the handler called once")
		require.EqualValues(t, 1, effects.Load())
	})
}

// While a delivery runs alone (its key held by another unit of work), a
// batch that every other delivery in flight joined closes at once. Before,
// the one running alone no longer counted as joined: the batch waited for
// its quiet tenth of MaxWait.
func TestABatchClosesAtOnceWhileADeliveryRunsAlone(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := deduplication.NewMemoryStore()
		holder := holdKey(t, store, "evt-0")
		h, err := deduplication.NewBatchHandler(deduplication.Config{Store: store, Consumer: "c", ClaimTimeout: 2 * time.Second},
			deduplication.BatchHandler{MaxBatch: 8, InFlight: 3, MaxWait: time.Second, Concurrency: 2,
				Handle: func(context.Context, []*message.Message) []error { return nil }})
		require.NoError(t, err)
		held := deliverTo(t.Context(), h, "0")
		time.Sleep(500 * time.Millisecond) // its batch closed (a quiet 100 ms), met the held key: evt-0 waits alone
		synctest.Wait()
		start := time.Now()
		others := []<-chan error{deliverTo(t.Context(), h, "1"), deliverTo(t.Context(), h, "2")}
		for _, res := range others {
			require.NoError(t, <-res)
		}
		require.Zero(t, time.Since(start), "the batch of every other delivery in flight closed at once")
		require.NoError(t, holder.Rollback(t.Context()))
		require.NoError(t, <-held)
	})
}

// holdKey claims key for consumer "c" in a unit of work of store it
// returns, open: another delivery of the key finds it held.
func holdKey(t *testing.T, store deduplication.Store, key string) unitofwork.Tx {
	t.Helper()
	tx, err := store.Begin(t.Context())
	require.NoError(t, err)
	ok, err := tx.Claim(t.Context(), "c", key)
	require.NoError(t, err)
	require.True(t, ok)
	return tx
}
