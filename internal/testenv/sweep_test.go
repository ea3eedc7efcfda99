package testenv_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// make test's first step, scripts/sweep.sh, stops what a killed run left:
// the processes of a directory whose owner (the test binary that made it,
// testenv.ClaimDir) is gone, and removes the directory; a directory whose
// owner runs — another run in progress — keeps its processes.
func TestTheSweepStopsWhatAKilledRunLeftAndNothingElse(t *testing.T) {
	t.Parallel()
	start := func(t *testing.T, name string, args ...string) *exec.Cmd {
		t.Helper()
		cmd := exec.CommandContext(context.Background(), name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	// dir makes a private directory owned by owner, and two processes
	// naming it: one in its command line (postgres -D, chromium), one in
	// its environment (a RabbitMQ node's beam.smp).
	dir := func(t *testing.T, prefix string, owner int) (string, []*exec.Cmd) {
		t.Helper()
		d, err := os.MkdirTemp("", prefix)
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(d) })
		require.NoError(t, os.WriteFile(filepath.Join(d, "owner.pid"), []byte(strconv.Itoa(owner)+"\n"), 0o644))
		return d, []*exec.Cmd{
			start(t, "sh", "-c", "sleep 600; : "+filepath.Join(d, "data")),
			start(t, "env", "RABBITMQ_MNESIA_BASE="+filepath.Join(d, "mnesia"), "sleep", "600"),
		}
	}

	// A killed run's test binary: gone (its pid was a process that ended).
	dead := start(t, "true")
	require.NoError(t, dead.Wait())
	left, leftProcs := dir(t, "sluice-rabbitmq-", dead.Process.Pid)
	// A run in progress: this test binary.
	live, liveProcs := dir(t, "sluice-postgres-", os.Getpid())

	out, err := exec.CommandContext(t.Context(), "bash", "../../scripts/sweep.sh").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "swept "+left)
	require.NotContains(t, string(out), live)

	for _, p := range leftProcs {
		exited := make(chan error, 1)
		go func() { exited <- p.Wait() }()
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Fatalf("%v still runs a minute after the sweep", p.Args)
		}
	}
	require.NoDirExists(t, left)
	require.DirExists(t, live)
	for _, p := range liveProcs {
		require.NoError(t, p.Process.Signal(syscall.Signal(0)), "the live run's %v runs on", p.Args)
	}
}

func TestClaimDirNamesThisProcess(t *testing.T) {
	t.Parallel()
	d := t.TempDir()
	require.NoError(t, testenv.ClaimDir(d))
	b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+"\n", string(b))
}
