package bounded

import (
	"errors"
	"testing"
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
