package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clusterScript is the script that runs a private cluster, relative to the
// repository's root.
const clusterScript = "scripts/rabbitmq-cluster.sh"

// clusterCommandTimeout bounds one command of the script: starting the
// nodes and joining them takes about 13 s on a development machine, 1m42s
// at load average 20, and outlived 3 minutes at 25 (make test's private
// chaos beside the shared broker's, stress-ng and other jobs).
const clusterCommandTimeout = 6 * time.Minute

// PrivateCluster is a RabbitMQ cluster of its own on this machine, run by
// scripts/rabbitmq-cluster.sh with free ports, node names of its own and a
// temporary state directory, for tests that kill nodes: the shared broker
// is never touched. Nodes are numbered from 0 here (the script numbers
// them from 1). Its nodes run from the installation under test
// (RabbitMQRoot), and it needs root, as StartPrivateRabbitMQ does. Its methods are safe for concurrent use, but a test that kills a
// node has the cluster to itself only if no other test uses it meanwhile.
type PrivateCluster struct {
	// URLs are the nodes' AMQP URLs (guest account), node i at URLs[i].
	URLs []string
	// Nodes are the nodes' Erlang names, for rabbitmqctl -n.
	Nodes []string

	dir, script string
	netns       string     // the nodes' network namespace, if Partitionable
	mu          sync.Mutex // serialises the script's commands
	closed      bool
}

// ClusterOptions are a private cluster's opt-in settings; the zero value
// is StartCluster's cluster.
type ClusterOptions struct {
	// Partitionable runs the nodes in a network namespace of their own
	// (SLUICE_CLUSTER_NETNS), created with the cluster and deleted by
	// Close, so that Partition can cut one off without a reset. Node i
	// is then reached at 127.0.0.<11+i> inside the namespace only: URLs
	// hold those addresses, which a connection reaches through
	// DialContext (a proxy in front of each node, StartProxyDialer).
	Partitionable bool
	// NetTicktime is the nodes' net_ticktime (Erlang's default, 60 s, if
	// zero): a node that stops answering is seen as down after 0.75 to
	// 1.25 times it. Whole seconds.
	NetTicktime time.Duration
	// PartitionHandling is RabbitMQ's cluster_partition_handling
	// (RabbitMQ's default, ignore, if empty).
	PartitionHandling string
	// DeadLetterConfirmTimeout is the nodes'
	// dead_letter_worker_publisher_confirm_timeout (RabbitMQ's default,
	// 180 s, if zero; whole milliseconds): how long a quorum queue's
	// at-least-once dead-letter worker waits before it sends again a copy
	// its target rejected or did not confirm (docs/retry-tiers.md).
	DeadLetterConfirmTimeout time.Duration
	// Script is scripts/rabbitmq-cluster.sh's path (default: found above
	// the working directory).
	Script string
}

// StartCluster starts a private cluster of n nodes joined into one; Close
// stops it and removes its files. For a cluster shared by a package's
// tests (started once, closed in TestMain); StartPrivateCluster is the
// one-test form.
func StartCluster(n int) (*PrivateCluster, error) {
	return StartClusterWith(n, ClusterOptions{})
}

// StartClusterWith is StartCluster with options.
func StartClusterWith(n int, o ClusterOptions) (*PrivateCluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("testenv: a cluster needs a node, got %d", n)
	}
	script := o.Script
	if script == "" {
		var err error
		if script, err = FindAbove(clusterScript); err != nil {
			return nil, err
		}
	}
	// The nodes run from the installation under test (RabbitMQRoot, if
	// set): their files are inside it.
	base := ""
	if RabbitMQRoot != "" {
		base = filepath.Join(RabbitMQRoot, "tmp")
	}
	dir, err := os.MkdirTemp(base, "sluice-cluster-")
	if err != nil {
		return nil, err
	}
	if err := ClaimDir(dir); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	// The nodes run as the rabbitmq user: their state directory, below
	// this one, must be reachable.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	c := &PrivateCluster{dir: dir, script: script}
	prefix := strings.ReplaceAll(Name("sluicec"), "_", "-") + "-n"
	env := []string{"SLUICE_CLUSTER_SIZE=" + strconv.Itoa(n), "SLUICE_CLUSTER_NAME=" + prefix}
	if RabbitMQRoot != "" {
		env = append(env, "SLUICE_CLUSTER_ROOT="+RabbitMQRoot)
	}
	if o.Partitionable {
		c.netns = prefix + "s"
		env = append(env, "SLUICE_CLUSTER_NETNS="+c.netns)
	}
	if o.NetTicktime > 0 {
		env = append(env, "SLUICE_CLUSTER_NET_TICKTIME="+strconv.Itoa(int(o.NetTicktime.Seconds())))
	}
	if o.DeadLetterConfirmTimeout > 0 {
		env = append(env, "SLUICE_CLUSTER_DLX_CONFIRM_TIMEOUT="+strconv.FormatInt(o.DeadLetterConfirmTimeout.Milliseconds(), 10))
	}
	if o.PartitionHandling != "" {
		env = append(env, "SLUICE_CLUSTER_PARTITION_HANDLING="+o.PartitionHandling)
	}
	// A port picked free may be taken before the node binds it (another
	// test, a scenario's node booting beside): a cluster that does not
	// start is started once more, on new ports, its first failure kept.
	first := c.startOn(n, prefix, env)
	if first == nil {
		return c, nil
	}
	_, _ = c.run([]string{"stop"}) // its nodes stopped, its state directory (and cluster.env) removed
	if err := c.startOn(n, prefix, env); err != nil {
		return nil, errors.Join(fmt.Errorf("starting the cluster once more after: %w", first), err, c.Close())
	}
	return c, nil
}

// startOn picks the nodes' ports (its Nodes and URLs) and starts the
// cluster's n nodes.
func (c *PrivateCluster) startOn(n int, prefix string, env []string) error {
	c.Nodes, c.URLs = nil, nil
	var ports, distPorts []string
	for i := range n {
		port, err := pickPort()
		if err != nil {
			return err
		}
		dist, err := pickPort()
		if err != nil {
			return err
		}
		ports, distPorts = append(ports, strconv.Itoa(port)), append(distPorts, strconv.Itoa(dist))
		host := "127.0.0.1"
		c.Nodes = append(c.Nodes, fmt.Sprintf("%s%d@localhost", prefix, i+1))
		if c.netns != "" {
			host = fmt.Sprintf("127.0.0.%d", 11+i)
			c.Nodes[i] = fmt.Sprintf("%s%d@%s", prefix, i+1, host)
		}
		c.URLs = append(c.URLs, fmt.Sprintf("amqp://guest:guest@%s:%d/", host, port))
	}
	env = append(slices.Clone(env), "SLUICE_CLUSTER_PORTS="+strings.Join(ports, " "), "SLUICE_CLUSTER_DIST_PORTS="+strings.Join(distPorts, " "))
	_, err := c.run([]string{"start"}, env...)
	return err
}

// StartPrivateCluster starts a private cluster of n nodes for t, stopped
// with its files removed when t ends.
func StartPrivateCluster(t testing.TB, n int) *PrivateCluster {
	t.Helper()
	return StartPrivateClusterWith(t, n, ClusterOptions{})
}

// StartPrivateClusterWith is StartPrivateCluster with options.
func StartPrivateClusterWith(t testing.TB, n int, o ClusterOptions) *PrivateCluster {
	t.Helper()
	c, err := StartClusterWith(n, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("stopping the private cluster: %v", err)
		}
	})
	return c
}

// Kill kills node i with SIGKILL (a crash: no clean shutdown, its
// connections reset) and returns once its VM is gone.
func (c *PrivateCluster) Kill(t testing.TB, i int) {
	t.Helper()
	c.node(t, "kill", i)
}

// Stop stops node i cleanly.
func (c *PrivateCluster) Stop(t testing.TB, i int) {
	t.Helper()
	c.node(t, "stop", i)
}

// Start starts node i again after Kill or Stop (it rejoins the cluster)
// and returns once it has booted; a running node is left as it is.
func (c *PrivateCluster) Start(t testing.TB, i int) {
	t.Helper()
	require.NoError(t, c.TryStart(context.Background(), i))
}

// TryStart is Start returning its error, ended early by ctx.
func (c *PrivateCluster) TryStart(ctx context.Context, i int) error {
	if i < 0 || i >= len(c.Nodes) {
		return fmt.Errorf("testenv: no node %d", i)
	}
	_, err := c.runContext(ctx, []string{"start", strconv.Itoa(i + 1)})
	return err
}

// PID returns the process id of node i's Erlang VM, from the script's pid
// file: the last VM the node ran in.
func (c *PrivateCluster) PID(i int) (int, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "state", fmt.Sprintf("node%d", i+1), "pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Partition cuts node i off, in a cluster started Partitionable: every
// packet from or to its address is dropped, so neither the other nodes nor
// its clients hear from it again, and nothing resets a connection.
func (c *PrivateCluster) Partition(t testing.TB, i int) {
	t.Helper()
	require.NotEmpty(t, c.netns, "Partition needs a cluster started Partitionable")
	c.node(t, "partition", i)
}

// Heal ends node i's partition.
func (c *PrivateCluster) Heal(t testing.TB, i int) {
	t.Helper()
	require.NotEmpty(t, c.netns, "Heal needs a cluster started Partitionable")
	c.node(t, "heal", i)
}

// Ctl runs rabbitmqctl args against node i and returns its output.
func (c *PrivateCluster) Ctl(t testing.TB, i int, args ...string) string {
	t.Helper()
	out, err := c.TryCtl(i, args...)
	require.NoError(t, err)
	return out
}

// TryCtl runs rabbitmqctl args against node i and returns its output or
// its error, for polling a node that may not answer.
func (c *PrivateCluster) TryCtl(i int, args ...string) (string, error) {
	if i < 0 || i >= len(c.Nodes) {
		return "", fmt.Errorf("testenv: no node %d", i)
	}
	return c.run(append([]string{"ctl", strconv.Itoa(i + 1)}, args...))
}

// Running reports whether node i answers.
func (c *PrivateCluster) Running(i int) bool {
	if c.netns != "" {
		_, err := c.TryCtl(i, "ping")
		return err == nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return rabbitmqCommand(ctx, nil, "rabbitmqctl", "-q", "-n", c.Nodes[i], "ping").Run() == nil
}

// QuorumLeader returns the index of the node leading the quorum queue,
// as node i sees it.
func (c *PrivateCluster) QuorumLeader(t testing.TB, i int, queue string) int {
	t.Helper()
	out := c.Ctl(t, i, "list_queues", "--no-table-headers", "name", "leader")
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == queue {
			for n, name := range c.Nodes {
				if name == f[1] {
					return n
				}
			}
			t.Fatalf("queue %s is led by %s, not a node of the cluster", queue, f[1])
		}
	}
	t.Fatalf("node %d does not list queue %s: %s", i, queue, out)
	return -1
}

// Close stops every node and removes the cluster's files. It is
// idempotent.
func (c *PrivateCluster) Close() error {
	c.mu.Lock()
	closed := c.closed
	c.closed = true
	c.mu.Unlock()
	if closed {
		return nil
	}
	_, err := c.run([]string{"stop"})
	return errors.Join(err, os.RemoveAll(c.dir))
}

func (c *PrivateCluster) node(t testing.TB, cmd string, i int) {
	t.Helper()
	require.Less(t, i, len(c.Nodes), "no node %d", i)
	_, err := c.run([]string{cmd, strconv.Itoa(i + 1)})
	require.NoError(t, err)
}

// run runs the script with args and env added to this process's
// environment, and returns its standard output.
func (c *PrivateCluster) run(args []string, env ...string) (string, error) {
	return c.runContext(context.Background(), args, env...)
}

// runContext is run, ended early by ctx.
func (c *PrivateCluster) runContext(ctx context.Context, args []string, env ...string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, clusterCommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...)
	cmd.Env = append(append(os.Environ(), "SLUICE_CLUSTER_DIR="+filepath.Join(c.dir, "state")), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s%s", clusterScript, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()), c.logs())
	}
	return string(out), nil
}

// logs returns the warning and error lines of each node's log since its
// last start (the script's own output says little when it is killed at
// clusterCommandTimeout), or "" when there are none.
func (c *PrivateCluster) logs() string {
	files := c.logFiles()
	var b strings.Builder
	for _, f := range files {
		lines, err := bootLines(f)
		if err != nil || len(lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s:\n%s", filepath.Base(f), strings.Join(lines[max(len(lines)-10, 0):], "\n"))
	}
	return b.String()
}

// LogLines returns, for each node's log, its last limit lines that
// contain one of substrs (a queue's name: its elections, its members
// started anew), each line cut to 300 bytes; "" when none does.
func (c *PrivateCluster) LogLines(substrs []string, limit int) string {
	var b strings.Builder
	for _, f := range c.logFiles() {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var lines []string
		for _, l := range strings.Split(string(data), "\n") {
			for _, s := range substrs {
				if strings.Contains(l, s) {
					lines = append(lines, l[:min(len(l), 300)])
					break
				}
			}
		}
		if len(lines) > 0 {
			fmt.Fprintf(&b, "%s:\n%s\n", filepath.Base(f), strings.Join(lines[max(len(lines)-limit, 0):], "\n"))
		}
	}
	return b.String()
}

// logFiles are the nodes' log files.
func (c *PrivateCluster) logFiles() []string {
	files, _ := filepath.Glob(filepath.Join(c.dir, "state", "node*", "log", "*.log"))
	return files
}

// FindAbove finds rel (a path from the repository's root, such as
// scripts/rabbitmq4.sh) above the working directory: a test runs in its
// package's directory, in the repository or a module under it, and so do
// the harnesses go run starts there.
func FindAbove(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("testenv: %s not found above the working directory", rel)
		}
		dir = parent
	}
}
