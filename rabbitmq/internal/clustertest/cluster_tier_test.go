package clustertest_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Copies waiting in a quorum tier when the node leading the tier and the
// main queue is killed are dead-lettered back to the main queue by the new
// leaders when their TTL runs out: at least once, none lost.
func TestClusterQuorumTierDeadLettersAfterALeaderChange(t *testing.T) {
	t.Parallel()
	c := privateCluster(t)
	const delay = 8 * time.Second
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: testenv.Name("cluster_tier"), Quorum: true, TierDelays: []time.Duration{delay}})
	require.NoError(t, err)
	_, err = topo.Declare(t.Context(), dialNode(t, c.URLs[0]))
	require.NoError(t, err)
	tier := topo.Tiers()[0].Topic
	deleteAtEnd(t, topo.Config().Queue, tier, topo.Config().PoisonQueue)
	require.Equal(t, 0, c.QuorumLeader(t, 1, tier), "declared through node 0, led by it")
	require.Equal(t, 0, c.QuorumLeader(t, 1, topo.Config().Queue))

	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: c.URLs[1], DialTimeout: 5 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	const n = 200
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
	}
	published := time.Now()
	require.NoError(t, p.Publish(tier, msgs...), "confirmed: on a majority of the tier's nodes")
	killNode(t, c, 0)
	require.Less(t, time.Since(published), delay, "the leader died before the copies expired")

	node2 := dialNode(t, c.URLs[2])
	ch := testenv.Channel(t, node2)
	require.NoError(t, testenv.AwaitCount(n, delay+2*time.Minute, 10*time.Minute, func() int {
		q, err := ch.QueueDeclarePassive(topo.Config().Queue, true, false, false, false, nil)
		if err != nil {
			return -1
		}
		return min(q.Messages, n)
	}), "the tier's copies back in the main queue")
	back := time.Since(published)
	copies := drainBodies(t, node2, topo.Config().Queue)
	for i := range n {
		require.GreaterOrEqual(t, copies[strconv.Itoa(i)], 1, "copy %d dead-lettered back", i)
	}
	require.True(t, testenv.Empty(t, node2, tier), "the tier is empty")
	extra := 0
	for _, k := range copies {
		extra += k - 1
	}
	t.Logf("%d copies back in the main queue %s after they were published with a %s TTL (the leader killed at once), %d duplicates", n, back.Round(time.Millisecond), delay, extra)
}
