package testenv_test

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// A private instance's port comes from below the kernel's ephemeral range
// (never handed to a connection or a listener on port 0) and stays
// reserved: a pick in another process (a second lock of the same file, as
// another process's would be) finds it taken.
func TestAPickedPortIsReservedAcrossTheSuitesProcesses(t *testing.T) {
	t.Parallel()
	ephemeral := testenv.EphemeralFirst()
	if ephemeral-testenv.PortsFirst < 1000 {
		t.Skipf("the ephemeral range begins at %d: no room below it, ports are the kernel's", ephemeral)
	}

	seen := map[int]bool{}
	for range 20 {
		port, err := testenv.PickPort()
		require.NoError(t, err)
		require.Less(t, port, ephemeral, "below the ephemeral range")
		require.False(t, seen[port], "port %d picked twice", port)
		seen[port] = true

		f, err := os.Open(testenv.PortLock(port))
		require.NoError(t, err)
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		_ = f.Close()
		require.ErrorIs(t, err, syscall.EWOULDBLOCK, "port %d is reserved", port)

		// Free: the pick's own check listened on it and closed. A child
		// forked meanwhile (a node's start, beside) holds that listener
		// until it execs, a moment: strace showed bind EADDRINUSE then.
		require.Eventually(t, func() bool {
			l, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				_ = l.Close()
			}
			return err == nil
		}, 10*time.Second, time.Millisecond, "port %d is free", port)
	}
}

// RabbitMQ boots without a TLS listener whose port is taken (only a plain
// AMQP listener's stops it): the start says so, and why, instead of
// handing out a TLSURL that another listener answers (TestCLIOverTLS read
// "first record does not look like a TLS handshake", once in ten runs).
func TestAPrivateNodeWithoutOneOfItsListenersIsReported(t *testing.T) {
	t.Parallel()
	l, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	files, _ := testenv.TestCA(t)
	n, err := testenv.StartRabbitMQ(testenv.PrivateRabbitMQOptions{TLS: &files, Config: fmt.Sprintf("listeners.ssl.taken = %s\n", l.Addr())})
	if err == nil {
		_ = n.Close()
	}
	require.ErrorContains(t, err, fmt.Sprintf("booted without its listeners listeners.ssl.taken %d", l.Addr().(*net.TCPAddr).Port))
	require.ErrorContains(t, err, "eaddrinuse", "the reason, from its log")
}
