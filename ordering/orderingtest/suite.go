// Package orderingtest is the conformance suite every ordering.Store
// passes (ordering.NewMemoryStore's, sluicesql.NewOrders').
package orderingtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/ordering"
)

// Run checks s: a key's unit of work excludes another of the same key
// until it ends (and a waiting Lock gives up with its context); holds are
// kept in arrival order, once per event id, and only what a unit of work
// committed stays; Unblock removes a key that holds nothing; Releasable
// lists the releasing keys that hold messages and are not locked; Stats and
// Keys count them; Waits agrees with Lock's State. consumer must
// be of this run alone.
func Run(t *testing.T, s ordering.Store, consumer string) {
	ctx := t.Context()
	lock := func(key string) ordering.Guard {
		t.Helper()
		g, err := s.Lock(ctx, consumer, key)
		require.NoError(t, err)
		return g
	}
	held := func(id string) ordering.Held {
		return ordering.Held{EventID: id, UUID: "u-" + id, Payload: []byte(id), Metadata: map[string]string{"k": "v\x00\xff"}}
	}
	waits := func(key string) bool {
		t.Helper()
		g := lock(key)
		defer func() { require.NoError(t, g.Rollback(ctx)) }()
		_, ok, err := g.State(ctx)
		require.NoError(t, err)
		w, err := s.Waits(ctx, consumer, key)
		require.NoError(t, err)
		require.Equal(t, ok, w, "Waits agrees with State")
		return ok
	}

	// A key blocked with a head, holding two messages (one held twice).
	g := lock("a")
	_, ok, err := g.State(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, g.Block(ctx, "a-1", false, "timeout"))
	for _, id := range []string{"a-2", "a-3", "a-2"} {
		require.NoError(t, g.Hold(ctx, held(id)))
	}
	require.NoError(t, g.Commit(ctx))
	require.True(t, waits("a"))

	// A rolled-back unit of work leaves nothing.
	g = lock("b")
	require.NoError(t, g.Block(ctx, "b-1", true, "poison"))
	require.NoError(t, g.Rollback(ctx))
	require.False(t, waits("b"))

	// Exclusion: a second Lock of the key waits until the first ends, and
	// gives up with its context.
	g = lock("a")
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = s.Lock(short, consumer, "a")
	cancel()
	require.Error(t, err, "a second Lock of a locked key waits, bounded by its context")
	other := lock("c") // another key is not locked
	require.NoError(t, other.Rollback(ctx))
	st, ok, err := g.State(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "a-1", st.Head)
	require.Equal(t, "timeout", st.Reason)
	require.NoError(t, g.Rollback(ctx))
	g = lock("a") // and once it ended, the key is free
	require.NoError(t, g.Rollback(ctx))

	// Releasing: the head done, the held messages in order, each removed.
	g = lock("a")
	require.NoError(t, g.Unblock(ctx))
	require.NoError(t, g.Commit(ctx))
	// Eventually: the Lock the short context gave up on above may still
	// take the key for a moment (Store.Lock), and Releasable skips a
	// locked key.
	var keys []string
	require.Eventually(t, func() bool {
		keys, err = s.Releasable(ctx, consumer, 10)
		require.NoError(t, err)
		return len(keys) > 0
	}, 2*time.Minute, 10*time.Millisecond, "the unblocked key becomes releasable")
	require.Equal(t, []string{"a"}, keys)
	g = lock("a")
	rel, err := s.Releasable(ctx, consumer, 10)
	require.NoError(t, err)
	require.Empty(t, rel, "a locked key is skipped")
	m, ok, err := g.Next(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, held("a-2").EventID, m.EventID)
	require.Equal(t, held("a-2").Payload, m.Payload)
	require.Equal(t, held("a-2").Metadata, m.Metadata, "metadata byte for byte")
	require.NoError(t, g.Remove(ctx, "a-2"))
	m, ok, err = g.Next(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "a-3", m.EventID)
	require.NoError(t, g.Commit(ctx))

	// Stats and Keys.
	g = lock("d")
	require.NoError(t, g.Block(ctx, "d-1", true, "bad version"))
	require.NoError(t, g.Hold(ctx, held("d-2")))
	require.NoError(t, g.Commit(ctx))
	stats, err := s.Stats(ctx, consumer)
	require.NoError(t, err)
	require.Equal(t, 1, stats.Releasing)
	require.Equal(t, 1, stats.Poisoned)
	require.Equal(t, 0, stats.Blocked)
	require.Equal(t, 2, stats.Held)
	require.False(t, stats.Oldest.IsZero())
	all, err := s.Keys(ctx, consumer, 10)
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, "a", all[0].Key, "oldest first")
	require.Equal(t, 1, all[0].Held)
	require.True(t, all[1].Poisoned)

	// Unblock removes a key that holds nothing more.
	g = lock("a")
	require.NoError(t, g.Remove(ctx, "a-3"))
	require.NoError(t, g.Unblock(ctx))
	require.NoError(t, g.Commit(ctx))
	require.False(t, waits("a"))
	stats, err = s.Stats(ctx, consumer)
	require.NoError(t, err)
	require.Equal(t, 0, stats.Releasing)

	// After Commit, Rollback does nothing.
	g = lock("e")
	require.NoError(t, g.Commit(ctx))
	require.NoError(t, g.Rollback(ctx))
}
