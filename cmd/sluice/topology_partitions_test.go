package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// TestTopologyPlanAndApplyPartitions: plan prints the consistent-hash
// exchange, the partition queues with their weights and single active
// consumer, each partition's tiers and the one poison queue; apply
// declares them; a bad --partitions is a usage error naming the field.
func TestTopologyPlanAndApplyPartitions(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	q := testenv.Name("topo_part")
	args := []string{"--queue", q, "--tiers", "1s,2s", "--partitions", "3", "--partition-key", "account_id"}
	require.Equal(t, 0, run(append([]string{"topology", "plan"}, args...), &out, &errOut), errOut.String())
	plan := out.String()
	require.Contains(t, plan, q+` x-consistent-hash {"hash-header":"account_id"}`)
	for p := range 3 {
		pq := fmt.Sprintf("%s.p%d", q, p)
		require.Contains(t, plan, "\n"+pq+" 1\n", "bound with weight 1")
		require.Contains(t, plan, "\n"+pq+` {"x-single-active-consumer":true}`)
		require.Contains(t, plan, "\n"+pq+`.retry.2s {"x-dead-letter-exchange":"","x-dead-letter-routing-key":"`+pq+`"`)
	}
	require.Contains(t, plan, "\n"+q+".poison {}")
	require.NotContains(t, plan, "\n"+q+" {", "no queue is named after the partitioned queue")

	names := []string{"exchange:" + q, q + ".poison"}
	for p := range 3 {
		pq := fmt.Sprintf("%s.p%d", q, p)
		names = append(names, pq, pq+".retry.1s", pq+".retry.2s")
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	out.Reset()
	require.Equal(t, 0, run(append([]string{"--amqp-url", testenv.AMQPURL, "topology", "apply"}, args...), &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "declared exchange "+q+" (x-consistent-hash)")
	require.Contains(t, out.String(), "declared "+q+".p2.retry.2s")
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), q+".p0"), "declared")

	errOut.Reset()
	require.Equal(t, 2, run([]string{"topology", "plan", "--queue", q, "--partitions", "2000", "--partition-key", "k"}, &out, &errOut))
	require.Contains(t, errOut.String(), "TopologyConfig.Partitions 2000")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"topology", "plan", "--queue", q, "--partitions", "2"}, &out, &errOut))
	require.Contains(t, errOut.String(), "TopologyConfig.PartitionKey is required")
}

// TestPartitionPoisonReplaysToItsPartition runs one handler per partition
// (router.Add on each of broker.Partitioned's Partitions) that poisons the
// first delivery of every event: the copies share one poison queue, each
// naming its partition queue, and `sluice dlq replay` sends each back to
// the partition it came from.
func TestPartitionPoisonReplaysToItsPartition(t *testing.T) {
	t.Parallel()
	q := testenv.Name("part_poison")
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, DepthInterval: -1,
		Topology: rabbitmq.TopologyConfig{Queue: q, Partitions: 3, PartitionKey: "account_id", TierDelays: []time.Duration{time.Minute}}})
	require.NoError(t, err)
	names := []string{"exchange:" + q}
	for _, tq := range b.Topology().Queues() {
		names = append(names, tq.Name)
	}
	testenv.DeleteQueuesAtEnd(t, names...)

	var mu sync.Mutex
	seen := map[string][]string{} // event id → the partition queue of each delivery
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	for i, part := range b.Partitions() {
		topic := part.Endpoints().Topic
		_, err = router.Add(r, router.HandlerConfig{
			Broker: part, Name: fmt.Sprintf("ledger-p%d", i), Consumers: 1,
			Stages: router.Stages{Poison: &poison.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}}, Classify: &stage.ClassifyConfig{}},
			Handler: func(msg *message.Message) error {
				mu.Lock()
				defer mu.Unlock()
				id := msg.Metadata.Get(sluice.EventIDKey)
				seen[id] = append(seen[id], topic)
				if len(seen[id]) == 1 {
					return sluice.Poison(errors.New("bad on first sight"))
				}
				return nil
			},
		})
		require.NoError(t, err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done); require.NoError(t, b.Close()) })

	const events = 12
	pub := b.PartitionPublisher()
	for k := range events {
		m := message.NewMessage(watermill.NewUUID(), []byte("{}"))
		m.Metadata.Set("account_id", fmt.Sprintf("acct-%d", k))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("e%d", k))
		require.NoError(t, pub.Publish(b.Topology().Config().Exchange, m))
	}
	poisonQueue := b.Topology().Config().PoisonQueue
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, poisonQueue) == events }, time.Minute, 20*time.Millisecond,
		"every partition's poisoned copies in the one poison queue")

	var out, errOut bytes.Buffer
	code := run([]string{"--amqp-url", testenv.AMQPURL, "--audit", filepath.Join(t.TempDir(), "audit.jsonl"), "--operator", "tester",
		"dlq", "replay", "--queue", poisonQueue}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, ps := range seen {
			if len(ps) < 2 {
				return false
			}
		}
		return len(seen) == events
	}, time.Minute, 20*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	used := map[string]bool{}
	for id, ps := range seen {
		require.Equal(t, []string{ps[0], ps[0]}, ps, "%s: replayed to the partition it was poisoned in", id)
		used[ps[0]] = true
	}
	require.Greater(t, len(used), 1, "the events spread over partitions")
}
