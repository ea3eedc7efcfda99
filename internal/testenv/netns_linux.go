package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// DialContext connects to addr from inside the cluster's network
// namespace (a cluster started Partitionable), where its nodes' addresses
// are: the socket is made by a thread that joined the namespace for the
// dial, and stays there.
func (c *PrivateCluster) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if c.netns == "" {
		return nil, errors.New("testenv: the cluster has no network namespace: start it Partitionable")
	}
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer func() { _ = home.Close() }()
		ns, err := os.Open("/run/netns/" + c.netns)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer func() { _ = ns.Close() }()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("testenv: joining network namespace %s: %w", c.netns, err)}
			return
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		done <- result{conn, err}
		// Back home, the thread serves the runtime again; if it cannot
		// return, it stays locked and ends with this goroutine.
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	r := <-done
	return r.conn, r.err
}
