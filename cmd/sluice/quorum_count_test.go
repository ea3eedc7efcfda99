package main

import (
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// RabbitMQ answers a passive queue.declare of a quorum queue with 0
// messages when the queue's leader does not answer within 250 ms
// (rabbit_quorum_queue:stat/2, 3.10 to 4.x) — as a loaded cluster's leader
// did, right after a node's restart, in sluice-chaos's cluster-node-kill.
// Here the poison queue's Ra server is suspended (sys:suspend, on the
// package's private node) until a basic.get reaches it: its count reads 0
// (checked first), and `sluice dlq inspect` and `stats` still find its five
// messages, and inspect the one of a queue that holds one (whose count,
// once it is read, is a true 0). Before: inspect listed none and stats
// counted 0 — the scan read as many messages as the count said.
func TestAPoisonQueueWhoseCountReadsZeroIsStillRead(t *testing.T) {
	t.Parallel()
	node, _ := privateNode(t)
	b := newBedAt(t, node.URL, rabbitmq.TopologyConfig{Queue: testenv.Name("cliz"), TierDelays: []time.Duration{time.Minute}, Quorum: true, DeliveryLimit: 5})
	poisonQ := b.topo.Config().PoisonQueue
	var want []string
	for i := 1; i <= 5; i++ {
		id := fmt.Sprint("e", i)
		want = append(want, id)
		b.poisoned(t, id, "order.created", sluice.Poison(errors.New("bad")))
	}
	conn, err := amqp.Dial(node.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()

	resumed := node.StallQuorumLeader(t, poisonQ, "dequeue", 1)
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(poisonQ, true, false, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, q.Messages, "a stalled leader's queue counts 0 (the fault this test needs)")
	_ = ch.Close()
	code, out, errOut := b.cli(t, "dlq", "inspect", "--queue", poisonQ)
	require.Equal(t, 0, code, errOut)
	var shown []string
	for _, m := range shownEvent.FindAllStringSubmatch(out, -1) {
		shown = append(shown, m[1])
	}
	require.Equal(t, want, shown, "inspect reads the queue that counted 0:\n%s", out)
	resumed()

	resumed = node.StallQuorumLeader(t, poisonQ, "dequeue", 1)
	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", poisonQ)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "5 messages", out)
	resumed()

	// One message: the count after reading it is 0, and true.
	one := newBedAt(t, node.URL, rabbitmq.TopologyConfig{Queue: testenv.Name("cliz1"), TierDelays: []time.Duration{time.Minute}, Quorum: true, DeliveryLimit: 5})
	one.poisoned(t, "e1", "order.created", sluice.Poison(errors.New("bad")))
	resumed = node.StallQuorumLeader(t, one.topo.Config().PoisonQueue, "dequeue", 1)
	code, out, errOut = one.cli(t, "dlq", "inspect", "--queue", one.topo.Config().PoisonQueue)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, [][]string{{"(event e1)", "e1"}}, shownEvent.FindAllStringSubmatch(out, -1), out)
	resumed()
}
