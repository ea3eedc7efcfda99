package testenv_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// A count that keeps moving is waited for however long it takes, up to the
// limit; one that stands still for the stall window, or goes past what is
// wanted, ends the wait with what it reached.
func TestAwaitCount(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	step := func() int { return int(n.Add(1)) } // moves at every poll
	require.NoError(t, testenv.AwaitCount(12, 200*time.Millisecond, time.Minute, step), "12 polls of 50 ms: longer than the stall window, never still")

	err := testenv.AwaitCount(5, 200*time.Millisecond, time.Minute, func() int { return 3 })
	require.ErrorContains(t, err, "3 of 5, unchanged for 200ms")
	require.ErrorContains(t, testenv.AwaitCount(5, time.Minute, time.Minute, func() int { return 6 }), "6 of 5, past the 5 wanted")

	n.Store(0)
	err = testenv.AwaitCount(1000, time.Minute, 300*time.Millisecond, step)
	require.ErrorContains(t, err, "after 300ms, still moving")
}

// AwaitDrained waits for what is left to reach 0, up or down meanwhile.
func TestAwaitDrained(t *testing.T) {
	t.Parallel()
	left := []int{3, 4, 2, 2, 1, 0}
	var i atomic.Int64
	require.NoError(t, testenv.AwaitDrained(200*time.Millisecond, time.Minute, func() int { return left[min(int(i.Add(1))-1, len(left)-1)] }))

	err := testenv.AwaitDrained(200*time.Millisecond, time.Minute, func() int { return 7 })
	require.ErrorContains(t, err, "7 left, unchanged for 200ms")
}
