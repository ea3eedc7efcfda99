package sluiceredis_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluiceredis"
	"github.com/sluicemq/sluice/unitofwork"
)

// deliverAll hands h a delivery of each event of ids at once, side by side,
// and returns each one's error.
func deliverAll(t *testing.T, h message.HandlerFunc, ids []string) map[string]error {
	t.Helper()
	var mu sync.Mutex
	out := map[string]error{}
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			m := message.NewMessage(fmt.Sprint("d-", i), nil)
			m.Metadata.Set(sluice.EventIDKey, id)
			m.SetContext(t.Context())
			_, err := h(m)
			mu.Lock()
			defer mu.Unlock()
			out[id] = err
		})
	}
	wg.Wait()
	return out
}

// hold claims key for consumer "c" in a unit of work it returns, open.
func hold(t *testing.T, store *sluiceredis.Inbox, key string) unitofwork.Tx {
	t.Helper()
	tx, err := store.Begin(t.Context())
	require.NoError(t, err)
	ok, err := tx.Claim(t.Context(), "c", key)
	require.NoError(t, err)
	require.True(t, ok)
	return tx
}

func eventIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint("evt-", i)
	}
	return out
}

// A batch on the Redis inbox one of whose keys another unit of work holds
// runs its events alone, in the handler's Concurrency slots: one at a time
// with Concurrency 1. Before, all at once (7 of 8).
func TestARedisBatchWithAHeldKeyKeepsToConcurrency(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, _, _ := newInbox(t)
	holder := hold(t, store, "evt-0")
	var running, peak atomic.Int64
	h, err := deduplication.NewBatchHandler(deduplication.Config{Store: store, Consumer: "c"},
		deduplication.BatchHandler{MaxBatch: 8, InFlight: 8, MaxWait: time.Second, Concurrency: 1,
			Handle: func(context.Context, []*message.Message) []error {
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(50 * time.Millisecond) // long enough for others to overlap, were they let
				running.Add(-1)
				return nil
			}})
	require.NoError(t, err)
	errs := deliverAll(t, h, eventIDs(8))
	require.ErrorIs(t, errs["evt-0"], deduplication.ErrClaimInProgress)
	require.EqualValues(t, 1, peak.Load(), "one unit of work at a time")
	require.NoError(t, holder.Rollback(ctx))
}

// A delivery whose key another unit of work holds on Redis fails with
// ErrClaimInProgress (Transient): Redis answered, it did not fail, so the
// brake does not count it. Before, the claim's error was a
// sluice.DependencyError, which brake.MatchUnreachable counts: copies of
// one event in flight at once could engage the brake.
func TestAKeyHeldOnRedisIsNotAnOutage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, _, _ := newInbox(t)
	holder := hold(t, store, "evt-1")
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "c"})
	require.NoError(t, err)
	h := inbox(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msg := message.NewMessage("d-1", nil)
	msg.Metadata.Set(sluice.EventIDKey, "evt-1")
	msg.SetContext(ctx)
	_, err = h(msg)
	require.ErrorIs(t, err, deduplication.ErrClaimInProgress)
	require.Equal(t, sluice.ClassTransient, sluice.DefaultClassifier().Classify(err))
	require.False(t, brake.MatchUnreachable(err), "not an outage: %v", err)
	require.NoError(t, holder.Rollback(ctx))
}

// On a Redis Cluster a batch's keys hash to several slots: the commit
// records every one. Before, the commit was one MULTI/EXEC, which a
// cluster client refuses for keys of several slots (CROSSSLOT): no batch
// was ever recorded, and its events ran again after each Lease.
func TestARedisClusterCommitsABatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	client := testenv.RedisCluster(t)
	store, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{})
	require.NoError(t, err)
	keys := eventIDs(16)
	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	got, err := tx.(deduplication.BatchClaimer).ClaimBatch(ctx, "c", keys, 0, 0)
	require.NoError(t, err)
	require.Equal(t, keys, got)
	require.NoError(t, tx.Commit(ctx))
	tx, err = store.Begin(ctx)
	require.NoError(t, err)
	got, err = tx.(deduplication.BatchClaimer).ClaimBatch(ctx, "c", keys, 0, 0)
	require.NoError(t, err)
	require.Empty(t, got, "every key of the batch recorded")
	require.NoError(t, tx.Commit(ctx))

	var done atomic.Int64
	h, err := deduplication.NewBatchHandler(deduplication.Config{Store: store, Consumer: "batch"},
		deduplication.BatchHandler{MaxBatch: 8, InFlight: 8, MaxWait: time.Second,
			Handle: func(_ context.Context, msgs []*message.Message) []error {
				done.Add(int64(len(msgs)))
				return nil
			}})
	require.NoError(t, err)
	for id, err := range deliverAll(t, h, keys[:8]) {
		require.NoError(t, err, id)
	}
	for id, err := range deliverAll(t, h, keys[:8]) {
		require.NoError(t, err, "%s again: a duplicate", id)
	}
	require.EqualValues(t, 8, done.Load(), "each event once")
}

// newInbox is a Redis inbox on keys of the test's own, and its client and
// prefix.
func newInbox(t testing.TB) (*sluiceredis.Inbox, *redis.Client, string) {
	t.Helper()
	client, prefix := testenv.Redis(t)
	store, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{Prefix: prefix})
	require.NoError(t, err)
	return store, client, prefix
}
