package chunks_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/internal/chunks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEach(t *testing.T) {
	t.Parallel()
	var got [][]int
	require.NoError(t, chunks.Each([]int{1, 2, 3, 4, 5}, 2, func(c []int) error { got = append(got, c); return nil }))
	require.Equal(t, [][]int{{1, 2}, {3, 4}, {5}}, got)
	calls := 0
	require.NoError(t, chunks.Each([]int{}, 2, func([]int) error { calls++; return nil }))
	require.Zero(t, calls, "nothing to do, no call")
	got = nil
	require.NoError(t, chunks.Each([]int{1, 2, 3}, 0, func(c []int) error { got = append(got, c); return nil }))
	require.Equal(t, [][]int{{1, 2, 3}}, got)
	stop := errors.New("stop")
	calls = 0
	require.ErrorIs(t, chunks.Each([]int{1, 2, 3}, 1, func([]int) error { calls++; return stop }), stop)
	require.Equal(t, 1, calls)
}
