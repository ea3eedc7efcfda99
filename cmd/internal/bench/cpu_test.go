package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	busy, total, cores, ok := parseProcStat([]byte("cpu  100 10 50 800 40 0 5 2 0 0\ncpu0 50 5 25 400 20 0 3 1 0 0\ncpu1 50 5 25 400 20 0 2 1 0 0\nintr 1\n"))
	require.True(t, ok)
	require.Equal(t, uint64(100+10+50+5+2), busy, "user, nice, system, softirq, steal")
	require.Equal(t, uint64(100+10+50+800+40+5+2), total)
	require.Equal(t, 2, cores)
	_, _, _, ok = parseProcStat([]byte("intr 1\n"))
	require.False(t, ok)
}
