// Package deduplicationtest is the conformance suite of deduplication.Store.
// Every store in Sluice runs it, and so should a store written elsewhere:
//
//	func TestMyStore(t *testing.T) {
//		deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
//			return newIsolatedStore(t) // a fresh table, prefix or database
//		})
//	}
package deduplicationtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/unitofwork"
)

// NewStore returns a store that no other call shares records with, cleaned
// up by t.Cleanup.
type NewStore func(t *testing.T) deduplication.Store

// Run runs the conformance suite against the stores newStore returns. Each
// subtest gets its own store and runs in parallel with the others.
func Run(t *testing.T, newStore NewStore) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s deduplication.Store)
	}{
		{"ClaimCommitThenDuplicate", testClaimCommitThenDuplicate},
		{"RollbackReleases", testRollbackReleases},
		{"ConsumersAreIndependent", testConsumersAreIndependent},
		{"KeysAreExact", testKeysAreExact},
		{"EndingTwice", testEndingTwice},
		{"ConcurrentClaimThenCommit", func(t *testing.T, s deduplication.Store) { testConcurrentClaim(t, s, true) }},
		{"ConcurrentClaimThenRollback", func(t *testing.T, s deduplication.Store) { testConcurrentClaim(t, s, false) }},
		{"ManyClaimersOneWinner", testManyClaimersOneWinner},
		{"DeleteBefore", testDeleteBefore},
		{"BatchHandlerRunsEachEventOnce", testBatchHandler},
		{"ClaimBatch", testClaimBatch},
		{"BatchOutsideTheEffectsIsNeverRunAgain", testBatchNeverRunAgain},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// claim begins a unit of work and claims (consumer, key) in it.
func claim(t *testing.T, s deduplication.Store, consumer, key string) (unitofwork.Tx, bool) {
	t.Helper()
	tx, err := s.Begin(t.Context())
	require.NoError(t, err)
	ok, err := tx.Claim(t.Context(), consumer, key)
	require.NoError(t, err)
	return tx, ok
}

// claimCommit claims and commits, and reports whether the claim was new.
func claimCommit(t *testing.T, s deduplication.Store, consumer, key string) bool {
	t.Helper()
	tx, ok := claim(t, s, consumer, key)
	require.NoError(t, tx.Commit(t.Context()))
	return ok
}

func testClaimCommitThenDuplicate(t *testing.T, s deduplication.Store) {
	require.True(t, claimCommit(t, s, "c", "k1"), "first claim")
	require.False(t, claimCommit(t, s, "c", "k1"), "claim after commit is a duplicate")
	require.True(t, claimCommit(t, s, "c", "k2"), "other key")
}

func testRollbackReleases(t *testing.T, s deduplication.Store) {
	tx, ok := claim(t, s, "c", "k")
	require.True(t, ok)
	require.NoError(t, tx.Rollback(t.Context()))
	require.True(t, claimCommit(t, s, "c", "k"), "claim after rollback is new")
}

func testConsumersAreIndependent(t *testing.T, s deduplication.Store) {
	require.True(t, claimCommit(t, s, "billing", "evt-1"))
	require.True(t, claimCommit(t, s, "shipping", "evt-1"), "same key, other consumer")
	require.False(t, claimCommit(t, s, "billing", "evt-1"))
	require.False(t, claimCommit(t, s, "shipping", "evt-1"))
}

func testKeysAreExact(t *testing.T, s deduplication.Store) {
	pairs := [][2]string{
		{"a:b", "c"}, {"a", "b:c"}, // no ambiguity from separators
		{"c", "Key"}, {"c", "key"}, // case matters
		{"c", "ключ-🔑"}, {"c", "ключ-🔑 "},
		{"c", strings.Repeat("x", 512)}, // deduplication.Config.KeyMaxLength's default
		{"c", "'; DROP TABLE x; --"},
	}
	for _, p := range pairs {
		require.True(t, claimCommit(t, s, p[0], p[1]), "first claim of %q/%q", p[0], p[1])
	}
	for _, p := range pairs {
		require.False(t, claimCommit(t, s, p[0], p[1]), "second claim of %q/%q", p[0], p[1])
	}
}

func testEndingTwice(t *testing.T, s deduplication.Store) {
	tx, ok := claim(t, s, "c", "k")
	require.True(t, ok)
	require.NoError(t, tx.Commit(t.Context()))
	require.NoError(t, tx.Rollback(t.Context()), "Rollback after Commit is a no-op")

	tx, err := s.Begin(t.Context())
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(t.Context()), "Rollback without a claim")
	require.NoError(t, tx.Rollback(t.Context()), "Rollback twice")
}

// testConcurrentClaim: while A holds a pair, B's claim of it must wait or
// report ErrClaimInProgress; once A ends, B sees A's outcome.
func testConcurrentClaim(t *testing.T, s deduplication.Store, commit bool) {
	a, ok := claim(t, s, "c", "k")
	require.True(t, ok)

	type result struct {
		tx  unitofwork.Tx
		ok  bool
		err error
	}
	res := make(chan result, 1)
	go func() {
		tx, err := s.Begin(context.Background())
		if err != nil {
			res <- result{err: err}
			return
		}
		ok, err := tx.Claim(context.Background(), "c", "k")
		res <- result{tx, ok, err}
	}()

	var early *result
	select {
	case r := <-res:
		early = &r
	case <-time.After(300 * time.Millisecond):
	}
	if early != nil {
		require.ErrorIs(t, early.err, deduplication.ErrClaimInProgress,
			"a claim of a held pair must wait or fail with ErrClaimInProgress, got ok=%v err=%v", early.ok, early.err)
		require.NoError(t, early.tx.Rollback(t.Context()))
	}

	if commit {
		require.NoError(t, a.Commit(t.Context()))
	} else {
		require.NoError(t, a.Rollback(t.Context()))
	}

	var b result
	if early == nil {
		select {
		case b = <-res:
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting claim did not return within 10s after the holder ended")
		}
		require.NoError(t, b.err)
	} else {
		b.tx, b.ok = claim(t, s, "c", "k")
	}
	require.Equal(t, !commit, b.ok, "after the holder's commit the key is a duplicate; after its rollback it is free")
	require.NoError(t, b.tx.Commit(t.Context()))
}

// claimRetryingTimeout bounds one key's claims in testManyClaimersOneWinner:
// SQLite serializes the 8 workers' transactions, and at a load of 20 one key
// took more than the 30 s this was before.
const claimRetryingTimeout = 2 * time.Minute

// testManyClaimersOneWinner: 8 workers race for each of 50 keys, retrying on
// ErrClaimInProgress; each key is won exactly once.
func testManyClaimersOneWinner(t *testing.T, s deduplication.Store) {
	const workers, keys = 8, 50
	var mu sync.Mutex
	wins := make(map[string]int)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for k := range keys {
				key := fmt.Sprintf("key-%d", (k+w*7)%keys)
				won, err := claimRetrying(s, key)
				if err != nil {
					errs <- err
					return
				}
				if won {
					mu.Lock()
					wins[key]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, wins, keys)
	for k, n := range wins {
		require.Equal(t, 1, n, "key %s won %d times", k, n)
	}
}

// claimRetrying claims key until no other claim is in progress, within
// claimRetryingTimeout; an error names the key and whether the time ran
// out (a transaction whose context ended is rolled back: its Commit fails).
func claimRetrying(s deduplication.Store, key string) (won bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), claimRetryingTimeout)
	defer cancel()
	defer func() {
		if err != nil {
			err = fmt.Errorf("claiming %s: %w (context: %v)", key, err, ctx.Err())
		}
	}()
	for {
		tx, err := s.Begin(ctx)
		if err != nil {
			return false, err
		}
		ok, err := tx.Claim(ctx, "c", key)
		if errors.Is(err, deduplication.ErrClaimInProgress) {
			_ = tx.Rollback(ctx)
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return false, err
		}
		return ok, tx.Commit(ctx)
	}
}

func testDeleteBefore(t *testing.T, s deduplication.Store) {
	// What sluicesql.Pruner deletes through (sluicesql.PrunerConfig.Store).
	d, ok := s.(interface {
		DeleteBefore(ctx context.Context, t time.Time, limit int) (int64, error)
	})
	if !ok {
		t.Skip("store does not implement DeleteBefore")
	}
	for i := range 25 {
		require.True(t, claimCommit(t, s, "c", fmt.Sprint("k", i)))
	}
	n, err := d.DeleteBefore(t.Context(), time.Now().Add(-time.Hour), 100)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is older than an hour")

	future := time.Now().Add(time.Hour)
	var total int64
	for _, want := range []int64{10, 10, 5} {
		n, err := d.DeleteBefore(t.Context(), future, 10)
		require.NoError(t, err)
		require.Equal(t, want, n, "batches are bounded by limit")
		total += n
	}
	require.Equal(t, int64(25), total)
	require.True(t, claimCommit(t, s, "c", "k3"), "a pruned key is new again")
}

// testBatchHandler: a batch handler on the store runs each event once and
// every delivery ends well, whether the store's units of work claim many
// keys (deduplication.BatchClaimer) or one (each event then runs in one of
// its own): 8 events delivered twice each, side by side, in batches of up
// to 8. A delivery whose copy another unit of work holds may fail with
// ErrClaimInProgress (a store whose Claim does not wait): it is delivered
// again, as the broker would.
func testBatchHandler(t *testing.T, s deduplication.Store) {
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	h, err := deduplication.NewBatchHandler(deduplication.Config{Store: s, Consumer: "batch"},
		deduplication.BatchHandler{MaxBatch: 8, InFlight: 16, Handle: func(_ context.Context, msgs []*message.Message) []error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				seen[m.Metadata.Get(sluice.EventIDKey)]++
			}
			return nil
		}})
	require.NoError(t, err)
	errs := make(chan error, 16)
	for i := range 16 {
		msg := message.NewMessage(fmt.Sprint("delivery-", i), nil)
		msg.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i%8))
		msg.SetContext(t.Context())
		go func() {
			for deadline := time.Now().Add(time.Minute); ; {
				_, err := h(msg)
				if !errors.Is(err, deduplication.ErrClaimInProgress) || time.Now().After(deadline) {
					errs <- err
					return
				}
				time.Sleep(10 * time.Millisecond) // the broker's redelivery
			}
		}()
	}
	for range 16 {
		require.NoError(t, <-errs)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 8, "every event handled")
	for k, n := range seen {
		require.Equal(t, 1, n, "%s handled once", k)
	}
}

// testClaimBatch, for a store whose units of work claim many keys at once
// (deduplication.BatchClaimer): a key committed before is left out, a
// rollback releases every key the batch claimed, a commit records them all,
// and a key another open unit of work holds is waited for or fails the
// batch with ErrClaimInProgress — never claimed twice.
func testClaimBatch(t *testing.T, s deduplication.Store) {
	ctx := t.Context()
	begin := func() (unitofwork.Tx, deduplication.BatchClaimer) {
		t.Helper()
		tx, err := s.Begin(ctx)
		require.NoError(t, err)
		bc, ok := tx.(deduplication.BatchClaimer)
		if !ok {
			require.NoError(t, tx.Rollback(ctx))
			t.Skip("the store's units of work claim one key (not a deduplication.BatchClaimer)")
		}
		return tx, bc
	}
	claimBatch := func(keys ...string) (unitofwork.Tx, []string) {
		t.Helper()
		tx, bc := begin()
		got, err := bc.ClaimBatch(ctx, "c", keys, 0, 0)
		require.NoError(t, err)
		return tx, got
	}
	require.True(t, claimCommit(t, s, "c", "done-1"))

	tx, got := claimBatch("done-1", "a", "b")
	require.ElementsMatch(t, []string{"a", "b"}, got, "a key committed before is left out")
	require.NoError(t, tx.Rollback(ctx))

	tx, got = claimBatch("a", "b", "c")
	require.ElementsMatch(t, []string{"a", "b", "c"}, got, "the rollback released every key of the batch")
	require.NoError(t, tx.Commit(ctx))
	tx, got = claimBatch("a", "d", "c")
	require.ElementsMatch(t, []string{"d"}, got, "the commit recorded every key of the batch")
	require.NoError(t, tx.Commit(ctx))
	require.False(t, claimCommit(t, s, "c", "b"), "a key a batch committed is a duplicate of a single claim")
	tx, got = claimBatch()
	require.Empty(t, got, "no keys, none claimed")
	require.NoError(t, tx.Commit(ctx))

	holder, got := claimBatch("h")
	require.Equal(t, []string{"h"}, got)
	type result struct {
		tx        unitofwork.Tx
		got       []string
		err       error
		afterEnds bool // the holder had begun to end when the claim returned
	}
	var ending atomic.Bool
	res := make(chan result, 1)
	go func() {
		tx, err := s.Begin(context.Background())
		if err != nil {
			res <- result{err: err}
			return
		}
		got, err := tx.(deduplication.BatchClaimer).ClaimBatch(context.Background(), "c", []string{"x", "h"}, 50*time.Millisecond, 0)
		res <- result{tx, got, err, ending.Load()}
	}()
	var r result
	returned := false
	select {
	case r = <-res:
		returned = true
	case <-time.After(300 * time.Millisecond): // or it waits for the holder
	}
	ending.Store(true)
	require.NoError(t, holder.Rollback(ctx))
	if !returned {
		select {
		case r = <-res:
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting batch did not return within 10s after the holder ended")
		}
	}
	if r.err != nil {
		require.ErrorIs(t, r.err, deduplication.ErrClaimInProgress, "a batch with a held key waits or fails with ErrClaimInProgress")
		require.NotNil(t, r.tx)
		require.NoError(t, r.tx.Rollback(ctx))
		r.tx, r.got = claimBatch("x", "h")
	} else {
		require.True(t, r.afterEnds, "a batch claimed %q while another unit of work held h", r.got)
	}
	require.ElementsMatch(t, []string{"x", "h"}, r.got, "the holder's rollback, and a failed batch's, released their keys")
	require.NoError(t, r.tx.Commit(ctx))
}

// testBatchNeverRunAgain, for a store whose units of work hold the claims
// only (deduplication.ClaimReleaser): a batch handler's batch is never run
// again, so an event that fails fails alone and every other event's
// effect, outside the unit of work, is done once; after a panic, none is
// done twice. 8 events side by side, one of them failing.
func testBatchNeverRunAgain(t *testing.T, s deduplication.Store) {
	tx, err := s.Begin(t.Context())
	require.NoError(t, err)
	_, ok := tx.(deduplication.ClaimReleaser)
	require.NoError(t, tx.Rollback(t.Context()))
	if !ok {
		t.Skip("the store's units of work are not deduplication.ClaimReleasers")
	}
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panic=%v", panics), func(t *testing.T) {
			var mu sync.Mutex
			effects := map[string]int{}
			h, err := deduplication.NewBatchHandler(deduplication.Config{Store: s, Consumer: fmt.Sprint("outside-", panics)},
				deduplication.BatchHandler{MaxBatch: 8, InFlight: 8, MaxWait: time.Second, Concurrency: 1,
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
							effects[id]++ // outside the store: a call, a file
						}
						return out
					}})
			require.NoError(t, err)
			errs := make(chan error, 8)
			for i := range 8 {
				msg := message.NewMessage(fmt.Sprint("delivery-", i), nil)
				msg.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
				msg.SetContext(t.Context())
				go func() { _, err := h(msg); errs <- err }()
			}
			failed := 0
			for range 8 {
				if <-errs != nil {
					failed++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for id, n := range effects {
				require.Equal(t, 1, n, "%s's effect done once (effects %v)", id, effects)
			}
			if !panics {
				require.Equal(t, 1, failed, "evt-7 alone failed")
				require.Len(t, effects, 7, "every other event done")
			}
		})
	}
}
