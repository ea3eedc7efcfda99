package main

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
)

// TestKillMidReplayLosesNothing kills the real binary (SIGKILL) in the middle
// of a rate-limited replay: every event is then in the poison queue, in the
// target queue, or in both — never in neither.
func TestKillMidReplayLosesNothing(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "sluice")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	b := newBed(t)
	const n = 30
	for i := range n {
		b.poisoned(t, fmt.Sprint("k", i), "order.created", sluice.Poison(errors.New("bad")))
	}
	cmd := exec.Command(bin, "--amqp-url", testenv.AMQPURL, "--audit", b.audit,
		"dlq", "replay", "--queue", b.topo.PoisonQueue(), "--rate", "40/s", "--batch", "2")
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Queue()) >= 6 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	seen := map[string]int{}
	for _, id := range append(ids(t, b.topo.Queue()), ids(t, b.topo.PoisonQueue())...) {
		seen[id]++
	}
	for i := range n {
		require.Positive(t, seen[fmt.Sprint("k", i)], "k%d was lost", i)
	}
	replayed := 0
	for _, c := range seen {
		replayed += c
	}
	require.Less(t, replayed-n, 3, "at most the batch in flight is in both places")
	t.Logf("killed mid-run: %d events, %d copies in all", n, replayed)
}
