package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicemq/sluice/internal/testenv"
)

// privateCluster is a RabbitMQ cluster of the harness's own, next to the
// shared broker (which it never touches): internal/testenv's, with the
// harness's kill (from the pid file, returning at once: the kill's moment
// is the harness's to measure from) and a close that also kills a node VM
// outliving the stop. Nodes are numbered from 0.
type privateCluster struct {
	*testenv.PrivateCluster

	mu   sync.Mutex
	pids map[int]bool // every Erlang VM a node ran in, for close's sweep
}

// startPrivateCluster starts n nodes joined into one cluster (o.Script:
// the cluster script's path, or "" to find it above the working
// directory). Its close stops them and removes their files; it is called
// on failure too.
func startPrivateCluster(n int, o testenv.ClusterOptions) (*privateCluster, error) {
	tc, err := testenv.StartClusterWith(n, o)
	if err != nil {
		return nil, err
	}
	c := &privateCluster{PrivateCluster: tc, pids: map[int]bool{}}
	c.notePIDs()
	return c, nil
}

// kill sends SIGKILL to node i's VM (no clean shutdown: its connections
// are reset), as the script's kill does, and returns at once: the kill's
// moment is the harness's to measure from. gone reports when the VM has
// exited (it takes a second or two after the signal).
func (c *privateCluster) kill(i int) (gone func() bool, err error) {
	pid, err := c.PID(i)
	if err != nil {
		return nil, err
	}
	if !c.isNodeVM(pid) {
		return nil, fmt.Errorf("node %s (pid %d) is not running", c.Nodes[i], pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return nil, fmt.Errorf("killing node %s (pid %d): %w", c.Nodes[i], pid, err)
	}
	return func() bool { return !c.isNodeVM(pid) }, nil
}

// start starts node i again; it rejoins the cluster. It returns once the
// node has booted.
func (c *privateCluster) start(ctx context.Context, i int) error {
	err := c.TryStart(ctx, i)
	c.notePIDs()
	return err
}

// queueState is what a node reports of a quorum queue.
type queueState struct {
	leader int    // the index of the leading node; -1 when none is known
	online string // the members online, as rabbitmqctl prints them
}

// queues returns the state of the named quorum queues as node i sees it,
// asking the next node when i does not answer.
func (c *privateCluster) queues(i int, names ...string) (map[string]queueState, error) {
	var errs []error
	for try := range c.Nodes {
		n := (i + try) % len(c.Nodes)
		out, err := c.TryCtl(n, "list_queues", "--no-table-headers", "name", "leader", "online")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		states := map[string]queueState{}
		for line := range strings.SplitSeq(out, "\n") {
			f := strings.SplitN(line, "\t", 3)
			if len(f) < 2 {
				continue
			}
			st := queueState{leader: c.nodeIndex(strings.TrimSpace(f[1])), online: ""}
			if len(f) == 3 {
				st.online = f[2]
			}
			states[f[0]] = st
		}
		for _, q := range names {
			if _, ok := states[q]; !ok {
				return nil, fmt.Errorf("node %d does not list queue %s: %q", n+1, q, out)
			}
		}
		return states, nil
	}
	return nil, errors.Join(errs...)
}

// allOnline reports whether every node is an online member of st's queue.
func (c *privateCluster) allOnline(st queueState) bool {
	for _, n := range c.Nodes {
		if !strings.Contains(st.online, n) {
			return false
		}
	}
	return true
}

func (c *privateCluster) nodeIndex(name string) int {
	for i, n := range c.Nodes {
		if n == name {
			return i
		}
	}
	return -1
}

// close stops every node, removes the cluster's files, and kills any VM
// of its nodes still running. It is safe to call more than once.
func (c *privateCluster) close() error {
	err := c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	// rabbitmqctl stop returns before the VM has exited: give it time.
	_ = poll(ctx, 15*time.Second, 100*time.Millisecond, func() (bool, error) {
		for pid := range c.pids {
			if c.isNodeVM(pid) {
				return false, nil
			}
		}
		return true, nil
	}, func() string { return "the nodes' VMs to exit" })
	for pid := range c.pids {
		if c.isNodeVM(pid) {
			err = errors.Join(err, fmt.Errorf("node VM %d outlived the stop by 15 s: killed", pid), syscall.Kill(pid, syscall.SIGKILL))
		}
		delete(c.pids, pid)
	}
	return err
}

// notePIDs remembers the VMs the nodes run in now (the script's pid files).
func (c *privateCluster) notePIDs() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.Nodes {
		if pid, err := c.PID(i); err == nil && pid > 0 {
			c.pids[pid] = true
		}
	}
}

// isNodeVM reports whether pid is alive and runs one of this cluster's
// nodes (its environment names the node: RabbitMQ starts distribution at
// run time, its command line has no name), so that a recycled pid is never
// killed.
func (c *privateCluster) isNodeVM(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	for _, n := range c.Nodes {
		if bytes.Contains(b, []byte("RABBITMQ_NODENAME="+n+"\x00")) {
			return true
		}
	}
	return false
}
