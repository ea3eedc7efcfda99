package bounded

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// What WatchProgress decides at each check: d without progress since the
// later of the start and the last move gives the call up, naming when its
// answer stopped; limit ends it however it moves; without moved, d is on
// the whole call.
func TestExpiry(t *testing.T) {
	t.Parallel()
	start := time.Now()
	at := func(d time.Duration) func() time.Time { return func() time.Time { return start.Add(d) } }
	const d, limit = 10 * time.Second, 300 * time.Second
	for _, c := range []struct {
		name  string
		now   time.Duration
		moved func() time.Time
		next  time.Duration // when not given up
		err   string
	}{
		{"no progress known: the whole call", d, nil, 0, "no answer within 10s"},
		{"nothing since the start", d, at(-time.Minute), 0, "no answer within 10s"},
		{"moving", d, at(d - time.Second), d - time.Second, ""},
		{"moved just now", 4 * d, at(4 * d), d, ""},
		{"stopped", 4*d + d, at(4 * d), 0, "no answer within 10s: it stopped coming 40s into the call"},
		{"near the limit: the limit first", limit - time.Second, at(limit - 2*time.Second), time.Second, ""},
		{"the limit, moving", limit, at(limit), 0, "no answer within 5m0s, the limit of a call whose answer keeps coming"},
	} {
		next, err := expiry(start, start.Add(c.now), d, limit, c.moved)
		if c.err == "" {
			require.NoError(t, err, c.name)
			require.Equal(t, c.next, next, c.name)
			continue
		}
		require.EqualError(t, err, c.err, c.name)
		require.True(t, errors.Is(err, ErrNoAnswer), c.name)
	}
}

// A call refused past Max outstanding, which the caller counts as given up,
// still has late release what it held: late gets the refusal, in the
// background, and counts as outstanding until it returns. Before, a refused
// call never ran late, and a caller that left its transaction to late (the
// inbox, past 64 calls given up to a database that stopped answering) left
// it open for good.
func TestACallRefusedPastMaxStillRunsItsLate(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		errTimeout := errors.New("timeout")
		c := &Calls{Max: 1, Grace: time.Millisecond, Timeout: errTimeout}
		hung := make(chan struct{})
		_, gaveUp, err := Run(c, t.Context(), time.Second, false, func(context.Context) (int, error) { <-hung; return 1, nil }, nil)
		require.True(t, gaveUp)
		require.ErrorIs(t, err, errTimeout)

		released := make(chan error, 1)
		ran := false
		_, gaveUp, err = Run(c, t.Context(), time.Second, false, func(context.Context) (int, error) { ran = true; return 2, nil },
			func(v int, err error) {
				require.Zero(t, v)
				released <- err
			})
		require.True(t, gaveUp, "refused: given up at once")
		require.ErrorIs(t, err, errTimeout)
		require.ErrorContains(t, err, "1 earlier calls still outstanding")
		require.ErrorIs(t, <-released, errTimeout, "late ran, with the refusal")
		require.False(t, ran, "the refused call was not started")
		close(hung)
		synctest.Wait()
		require.Zero(t, c.outstanding.Load(), "nothing outstanding once both ended")
	})
}
