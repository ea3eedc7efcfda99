package sluiceredis_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/deduplicationtest"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/sluiceredis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	deduplicationtest.Run(t, func(t *testing.T) deduplication.Store {
		client, prefix := testenv.Redis(t)
		s, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{Prefix: prefix})
		require.NoError(t, err)
		return s
	})
}

// TestCommitOutlivesTheHandlersDeadline: a handler that succeeds just as its
// deadline ends (Watermill's Timeout, the shutdown grace running out) is
// committed. On Redis the handler's effects are outside the unit of work: a
// commit failed with the deadline left the key pending and the handler ran
// again after the lease — 2 effects for one successful run.
func TestCommitOutlivesTheHandlersDeadline(t *testing.T) {
	t.Parallel()
	client, prefix := testenv.Redis(t)
	store, err := sluiceredis.NewInbox(client, sluiceredis.InboxConfig{Prefix: prefix, Lease: time.Second})
	require.NoError(t, err)
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "mailer"})
	require.NoError(t, err)
	var effects atomic.Int32
	running := make(chan struct{}, 1)
	h := inbox(func(msg *message.Message) ([]*message.Message, error) {
		running <- struct{}{}
		<-msg.Context().Done() // the work ends with the deadline…
		effects.Add(1)         // …and succeeded: the mail is sent
		return nil, nil
	})
	deliver := func() error {
		// The deadline passes once the handler runs (not after a fixed
		// 50 ms: on a loaded machine the claim alone took longer).
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		go func() {
			select {
			case <-running:
				cancel(context.DeadlineExceeded)
			case <-ctx.Done():
			}
		}()
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(sluice.EventIDKey, "evt-1")
		msg.SetContext(ctx)
		_, err := h(msg)
		return err
	}
	require.NoError(t, deliver(), "the successful run is committed")
	keys, err := client.Keys(t.Context(), prefix+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, "done", client.Get(t.Context(), keys[0]).Val(), "recorded as done, not left pending for the lease")
	require.NoError(t, deliver(), "the redelivery is a duplicate, not a claim in progress")
	require.Equal(t, int32(1), effects.Load(), "the redelivery is a duplicate")
}

// roundTrips counts a client's round trips to Redis: each command sent
// alone and each pipeline (a MULTI/EXEC included) is one; a new
// connection's handshake (HELLO, CLIENT SETINFO) is not counted.
type roundTrips struct{ n atomic.Int64 }

func (*roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !connectionSetup(cmd) {
			r.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !connectionSetup(cmds[0]) {
			r.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

func connectionSetup(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

// A batch handler's claim on the Redis inbox is one round trip for the
// whole batch, and so is its commit: its units of work claim many keys
// (deduplication.BatchClaimer). Before, they claimed one, and each event of
// a batch ran alone — a round trip for each claim and each commit, and a
// handler call for each event.
func TestTheRedisInboxClaimsABatchInOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, client, prefix := newInbox(t)
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprint("evt-", i)
	}
	for _, k := range keys[:8] { // done before
		tx, err := store.Begin(ctx)
		require.NoError(t, err)
		ok, err := tx.Claim(ctx, "projection", k)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, tx.Commit(ctx))
	}
	trips := &roundTrips{}
	client.AddHook(trips)

	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	bc, ok := tx.(deduplication.BatchClaimer)
	require.True(t, ok, "the Redis inbox's unit of work claims a batch's keys at once")
	got, err := bc.ClaimBatch(ctx, "projection", keys, 0, 0)
	require.NoError(t, err)
	require.Equal(t, keys[8:], got, "the keys done before are left out, the others claimed in order")
	require.EqualValues(t, 1, trips.n.Load(), "one round trip for 64 claims")
	require.NoError(t, tx.Commit(ctx))
	require.EqualValues(t, 2, trips.n.Load(), "one round trip for the commit of 56 keys")
	for _, k := range got {
		v, err := client.Get(ctx, prefix+"10:projection:"+k).Result()
		require.NoError(t, err)
		require.Equal(t, "done", v, "%s recorded as done", k)
		ttl, err := client.PTTL(ctx, prefix+"10:projection:"+k).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, 6*24*time.Hour, "%s kept for the retention (7 days)", k)
	}

	// A batch another unit of work holds a key of fails at once, and its
	// rollback releases what it claimed.
	holder, err := store.Begin(ctx)
	require.NoError(t, err)
	ok, err = holder.Claim(ctx, "projection", "held")
	require.NoError(t, err)
	require.True(t, ok)
	tx, err = store.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.(deduplication.BatchClaimer).ClaimBatch(ctx, "projection", []string{"free", "held"}, time.Minute, time.Minute)
	require.ErrorIs(t, err, deduplication.ErrClaimInProgress)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, client.Exists(ctx, prefix+"10:projection:free").Val(), "the failed batch's claim of free is released")
	require.Equal(t, "pending:", client.Get(ctx, prefix+"10:projection:held").Val()[:8], "the holder's claim is left alone")
	require.NoError(t, holder.Rollback(ctx))
}
