package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// RedisCluster starts a private Redis Cluster — three masters, no replicas,
// nothing persisted, on ports of its own — and returns a client of it; the
// servers are stopped when t ends. Their directory, /tmp/sluice-redis-*,
// names its owner (ClaimDir) and is their working directory (Redis writes
// its title over its command line and environment), so scripts/sweep.sh
// stops what a killed run left. Every wait on it is bounded.
func RedisCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-redis-")
	require.NoError(t, err)
	require.NoError(t, ClaimDir(dir))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	addrs := make([]string, 3)
	for i := range addrs {
		port, err := pickPort()
		require.NoError(t, err)
		bus, err := pickPort()
		require.NoError(t, err)
		addrs[i] = "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--cluster-port", strconv.Itoa(bus),
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
			"--dir", dir, "--save", "", "--appendonly", "no", "--logfile", filepath.Join(dir, fmt.Sprintf("%d.log", port)))
		cmd.Dir = dir
		require.NoError(t, cmd.Start(), "redis-server (run `make services`)")
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		err := until(ctx, func() bool { return c.Ping(ctx).Err() == nil })
		_ = c.Close()
		require.NoError(t, err, "the cluster's node %s did not answer", a)
	}
	out, err := exec.CommandContext(ctx, "redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	require.NoError(t, err, "redis-cli --cluster create: %s", out)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		err := until(ctx, func() bool {
			info, err := c.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
		_ = c.Close()
		require.NoError(t, err, "the cluster's node %s is not ready", a)
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	require.NoError(t, until(ctx, func() bool {
		return client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }) == nil
	}))
	return client
}

// until polls ready every 50 ms until it reports true (nil) or ctx ends
// (ctx's error).
func until(ctx context.Context, ready func() bool) error {
	for !ready() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
