package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clusterScript runs the private cluster, relative to the repository's
// root (internal/testenv's StartCluster drives the same script for tests).
const clusterScript = "scripts/rabbitmq-cluster.sh"

// clusterCommandTimeout bounds one command of the script: the script bounds
// each node's boot by 90 s itself; starting and joining 3 nodes takes
// about 20 s on a loaded 2-core machine.
const clusterCommandTimeout = 3 * time.Minute

// privateCluster is a RabbitMQ cluster of the harness's own, next to the
// shared broker (which it never touches): its own node names, ports and
// state directory. Nodes are numbered from 0 here, from 1 by the script.
type privateCluster struct {
	urls, nodes []string
	dir, script string

	mu   sync.Mutex
	pids map[int]bool // every Erlang VM a node ran in, for close's sweep
}

// startPrivateCluster starts n nodes joined into one cluster. Its close
// stops them and removes their files; it is called on failure too.
func startPrivateCluster(ctx context.Context, n int, script string) (*privateCluster, error) {
	if script == "" {
		var err error
		if script, err = findClusterScript(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "sluice-chaos-cluster-")
	if err != nil {
		return nil, err
	}
	// The nodes run as the rabbitmq user: their state directory, below
	// this one, must be reachable.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	c := &privateCluster{dir: dir, script: script, pids: map[int]bool{}}
	prefix := fmt.Sprintf("sluicechaos%d-n", rand.Uint32())
	var ports, distPorts []string
	for i := range n {
		port, err := freePort()
		if err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
		dist, err := freePort()
		if err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
		ports, distPorts = append(ports, strconv.Itoa(port)), append(distPorts, strconv.Itoa(dist))
		c.urls = append(c.urls, fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port))
		c.nodes = append(c.nodes, fmt.Sprintf("%s%d@localhost", prefix, i+1))
	}
	_, err = c.run(ctx, []string{"start"}, "SLUICE_CLUSTER_SIZE="+strconv.Itoa(n), "SLUICE_CLUSTER_NAME="+prefix,
		"SLUICE_CLUSTER_PORTS="+strings.Join(ports, " "), "SLUICE_CLUSTER_DIST_PORTS="+strings.Join(distPorts, " "))
	c.notePIDs()
	if err != nil {
		return nil, errors.Join(err, c.close())
	}
	return c, nil
}

// kill sends SIGKILL to node i's VM (no clean shutdown: its connections
// are reset), as the script's kill does, and returns at once: the kill's
// moment is the harness's to measure from. gone reports when the VM has
// exited (it takes a second or two after the signal).
func (c *privateCluster) kill(i int) (gone func() bool, err error) {
	pid, err := c.pid(i)
	if err != nil {
		return nil, err
	}
	if !c.isNodeVM(pid) {
		return nil, fmt.Errorf("node %s (pid %d) is not running", c.nodes[i], pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return nil, fmt.Errorf("killing node %s (pid %d): %w", c.nodes[i], pid, err)
	}
	return func() bool { return !c.isNodeVM(pid) }, nil
}

// pid reads the pid file of node i's VM.
func (c *privateCluster) pid(i int) (int, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "state", fmt.Sprintf("node%d", i+1), "pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// start starts node i again; it rejoins the cluster. It returns once the
// node has booted.
func (c *privateCluster) start(ctx context.Context, i int) error {
	_, err := c.run(ctx, []string{"start", strconv.Itoa(i + 1)})
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
func (c *privateCluster) queues(ctx context.Context, i int, names ...string) (map[string]queueState, error) {
	var errs []error
	for try := range c.nodes {
		n := (i + try) % len(c.nodes)
		out, err := c.run(ctx, []string{"ctl", strconv.Itoa(n + 1), "list_queues", "--no-table-headers", "name", "leader", "online"})
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
	for _, n := range c.nodes {
		if !strings.Contains(st.online, n) {
			return false
		}
	}
	return true
}

func (c *privateCluster) nodeIndex(name string) int {
	for i, n := range c.nodes {
		if n == name {
			return i
		}
	}
	return -1
}

// close stops every node, removes the cluster's files, and kills any VM
// of its nodes still running. It is safe to call more than once.
func (c *privateCluster) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterCommandTimeout)
	defer cancel()
	_, err := c.run(ctx, []string{"stop"})
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
	return errors.Join(err, os.RemoveAll(c.dir))
}

// notePIDs remembers the VMs the nodes run in now (the script's pid files).
func (c *privateCluster) notePIDs() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.nodes {
		if pid, err := c.pid(i); err == nil && pid > 0 {
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
	for _, n := range c.nodes {
		if bytes.Contains(b, []byte("RABBITMQ_NODENAME="+n+"\x00")) {
			return true
		}
	}
	return false
}

// run runs the script with args, bounded by clusterCommandTimeout, and
// returns its standard output.
func (c *privateCluster) run(ctx context.Context, args []string, env ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, clusterCommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...)
	cmd.Env = append(append(os.Environ(), "SLUICE_CLUSTER_DIR="+filepath.Join(c.dir, "state")), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", clusterScript, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// findClusterScript finds clusterScript above the working directory.
func findClusterScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, clusterScript)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found above the working directory: run from the repository or pass -cluster-script", clusterScript)
		}
		dir = parent
	}
}

func freePort() (int, error) {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
