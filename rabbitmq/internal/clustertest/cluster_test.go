package clustertest_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// The tests that kill nodes share one private 3-node cluster, started by
// the first of them and stopped by TestMain: starting one takes about 13 s.
// They run one at a time (each kills a node: privateCluster holds the
// cluster until the test's end), beside TestClusterPartitionedNode, which
// has a cluster of its own; no other test uses the cluster. A killed node
// is started again by the next test that takes the cluster, not after the
// last one. (Run last on this cluster, made partitionable, the partition
// test saved 6 to 10 CPU-seconds a run and cost 30 to 60 s of wall time:
// issue 41.)
var cluster struct {
	once sync.Once
	use  sync.Mutex // held by the test using the cluster
	c    *testenv.PrivateCluster
	err  error
	// down are the nodes killed by the test before, started again by the
	// next test that takes the cluster.
	down []int
	// garbage are the queues of the tests before (deleteAtEnd).
	garbage []string
}

// privateCluster returns the shared cluster, held by t until t ends (its
// cleanups, registered after this call, run first), with every node
// running. Call it first.
func privateCluster(t *testing.T) *testenv.PrivateCluster {
	t.Helper()
	cluster.use.Lock()
	t.Cleanup(cluster.use.Unlock)
	cluster.once.Do(func() {
		start := time.Now()
		cluster.c, cluster.err = testenv.StartCluster(3)
		t.Logf("private cluster of 3 nodes started in %s", time.Since(start).Round(time.Millisecond))
	})
	require.NoError(t, cluster.err, "starting the private cluster")
	c := cluster.c
	for len(cluster.down) > 0 {
		i, start := cluster.down[0], time.Now()
		c.Start(t, i)
		cluster.down = cluster.down[1:]
		t.Logf("node %d, killed by the test before, started again in %s", i, time.Since(start).Round(time.Millisecond))
	}
	if len(cluster.garbage) > 0 {
		start := time.Now()
		deleteQueues(t, c.URLs, cluster.garbage)
		t.Logf("%d queues of the tests before deleted in %s", len(cluster.garbage), time.Since(start).Round(time.Millisecond))
		cluster.garbage = nil
	}
	return c
}

// closeCluster stops the shared cluster if a test started it.
func closeCluster() error {
	if cluster.c == nil {
		return nil
	}
	return cluster.c.Close()
}

// killNode kills node i (SIGKILL); the next test that takes the cluster
// starts it again.
func killNode(t *testing.T, c *testenv.PrivateCluster, i int) {
	t.Helper()
	cluster.down = append(cluster.down, i) // Start leaves a running node as it is
	c.Kill(t, i)
}

// dialNode connects to one node, closed when t ends.
func dialNode(t *testing.T, nodeURL string) *amqp.Connection {
	t.Helper()
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: nodeURL, DialTimeout: 5 * time.Second}, "sluice test")
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// declareOnNode declares a quorum topology of t's own through node i,
// which then leads its queues (RabbitMQ's default leader locator is
// client-local), and deletes its queues when t ends.
func declareOnNode(t *testing.T, c *testenv.PrivateCluster, i int, prefix string) *rabbitmq.Topology {
	t.Helper()
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: testenv.Name(prefix), Quorum: true})
	require.NoError(t, err)
	_, err = topo.Declare(t.Context(), dialNode(t, c.URLs[i]))
	require.NoError(t, err)
	deleteAtEnd(t, topo.Config().Queue, topo.Config().PoisonQueue)
	require.Equal(t, i, c.QuorumLeader(t, (i+1)%len(c.URLs), topo.Config().Queue), "declared through node %d, led by it", i)
	return topo
}

// deleteAtEnd has the queues deleted once t ends: by the next test that
// takes the cluster, once the node t killed runs again (a quorum queue
// with a member down took about 5 s to delete, each), or with the
// cluster after the last.
func deleteAtEnd(t *testing.T, queues ...string) {
	t.Helper()
	t.Cleanup(func() { cluster.garbage = append(cluster.garbage, queues...) })
}

// deleteQueues deletes the queues through the first node that answers.
func deleteQueues(t *testing.T, urls []string, queues []string) {
	t.Helper()
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URLs: urls, DialTimeout: 5 * time.Second}, "")
	if err != nil {
		t.Errorf("deleting the queues the test before left: %v", err)
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("deleting the queues the test before left: %v", err)
		return
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}

// A Consumer whose node dies — the one leading the quorum queue — while
// deliveries are in flight reconnects to another node and drains the
// queue: every message is handled, the redeliveries are at most the
// deliveries unacked at the kill, and nothing is left in the queue. The
// Broker's publisher, on the dead node too, moves with it: messages
// published after the kill are consumed as well.
func TestClusterConsumerNodeKilledMidDrain(t *testing.T) {
	t.Parallel()
	c := privateCluster(t)
	const prefetch = 16
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URLs: c.URLs, DialTimeout: 5 * time.Second},
		Topology:   rabbitmq.TopologyConfig{Queue: testenv.Name("cluster_consume"), Quorum: true},
		Prefetch:   prefetch,
	})
	require.NoError(t, err)
	q := b.Topology().Config().Queue
	deleteAtEnd(t, q, b.Topology().Config().PoisonQueue)
	require.Equal(t, 0, c.QuorumLeader(t, 1, q), "the Broker declared its topology through node 0")

	publish := func(from, n int) {
		msgs := make([]*message.Message, n)
		for k := range msgs {
			msgs[k] = message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(from+k)))
		}
		require.NoError(t, b.Publisher().Publish(q, msgs...))
	}
	const before, after, holdAt = 1000, 200, 300
	publish(0, before)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	deliveries, err := b.Endpoints().Subscriber.Subscribe(ctx, q)
	require.NoError(t, err)
	var (
		mu          sync.Mutex
		handled     = map[string]int{}
		held        = make(chan struct{})
		killed      = make(chan struct{})
		drained     = make(chan struct{})
		drainedOnce sync.Once
		handlerDone = make(chan struct{})
	)
	go func() {
		defer close(handlerDone)
		n := 0
		for msg := range deliveries {
			mu.Lock()
			handled[string(msg.Payload)]++
			all := len(handled) == before+after
			mu.Unlock()
			if n++; n == holdAt {
				close(held) // deliveries are in flight on node 0's channel
				<-killed
			}
			msg.Ack()
			if all {
				drainedOnce.Do(func() { close(drained) })
			}
		}
	}()
	defer func() {
		cancel()
		select {
		case <-killed:
		default:
			close(killed)
		}
		require.NoError(t, b.Close())
		<-handlerDone
	}()

	select {
	case <-held:
	case <-time.After(2 * time.Minute): // a liveness bound on a loaded machine's cluster
		t.Fatal("the consumer did not take the deliveries")
	}
	start := time.Now()
	killNode(t, c, 0)
	close(killed)
	publish(before, after)
	// The 1,100 left, waited for while they come (a loaded machine moves
	// them slowly through the new leader), up to a minute without one.
	require.NoError(t, testenv.AwaitCount(before+after, 60*time.Second, 10*time.Minute, func() int { mu.Lock(); defer mu.Unlock(); return len(handled) }),
		"every message handled after the kill")
	<-drained // closed by the handler as it acks the last
	t.Logf("every message handled %s after node 0 was killed", time.Since(start).Round(time.Millisecond))

	cancel()
	require.NoError(t, b.Close())
	<-handlerDone
	mu.Lock()
	defer mu.Unlock()
	redelivered := 0
	for _, n := range handled {
		redelivered += n - 1
	}
	require.LessOrEqual(t, redelivered, prefetch, "only the deliveries unacked at the kill come again")
	require.True(t, testenv.Empty(t, dialNode(t, c.URLs[2]), q), "the queue is drained")
	t.Logf("%d messages handled, %d redelivered after the kill", len(handled), redelivered)
}
