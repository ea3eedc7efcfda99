package main

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
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

// shownPayload is a message `dlq inspect` shows, by its payload (m0000).
var shownPayload = regexp.MustCompile(`payload +│ (m\d{4}) `)

// A poison queue whose count stays 0 while it serves basic.get — the node
// made to count it 0 (testenv.PrivateRabbitMQ.CountZero), 1,001 messages:
// `sluice dlq inspect` shows every one, counted by the basic.get's answer,
// and they are all back after, in order. Before: it read on, counting
// after each message, and after 1,000 with no count it failed ("the broker
// gives no count of the queue").
func TestAPoisonQueueWhoseCountStaysZeroIsReadWhole(t *testing.T) {
	t.Parallel()
	node, b, conn, want := quorumPoisonQueueOf(t, "clinc", 1001, nil)
	poisonQ := b.topo.Config().PoisonQueue

	restore := node.CountZero(t, poisonQ)
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(poisonQ, true, false, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, q.Messages, "the node counts the queue 0 (the fault this test needs)")
	code, out, errOut := b.cli(t, "dlq", "inspect", "--queue", poisonQ)
	require.Equal(t, 0, code, errOut)
	var shown []string
	for _, m := range shownPayload.FindAllStringSubmatch(out, -1) {
		shown = append(shown, m[1])
	}
	require.Equal(t, want, shown, "every message shown, in order")
	restore()
	got := bodiesOf(t, conn, poisonQ)
	require.Equal(t, want, got, "every message read went back, in order: %d of %d out of order", outOfOrder(want, got), len(want))
}

// A quorum poison queue of 500 messages, read whole by `sluice dlq stats`,
// holds them after in the order it held them before. Before (dlq/scan.go
// of 14bf89a): 430 of them out of order (432 on RabbitMQ 4.0.5; the
// failure prints it) — the scan's basic.nacks
// outran what the broker's quorum queue client keeps unapplied (32
// commands), and past that it sends the returns in a map's order (dlq's
// returnChunk).
func TestAScanPutsALargeQuorumPoisonQueueBackInOrder(t *testing.T) {
	t.Parallel()
	_, b, conn, want := quorumPoisonQueueOf(t, "clilo", 500, nil)
	code, _, errOut := b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue)
	require.Equal(t, 0, code, errOut)
	got := bodiesOf(t, conn, b.topo.Config().PoisonQueue)
	require.Equal(t, want, got, "every message read went back, in order: %d of %d out of order", outOfOrder(want, got), len(want))
}

// A replay of every other message of a quorum poison queue of 400, in
// batches of 100: the 200 it leaves hold their order. The replay acks each
// batch after its confirms — 100 commands the broker's quorum queue client
// may hold unapplied when the scan then puts the rest back. Before (with
// returnChunk, without dlq's settleWindow): 6 of the 200 out of order, the
// first ones returned; with neither (14bf89a), 176 (175 on RabbitMQ 4.0.5).
func TestAReplayInLargeBatchesLeavesTheRestInOrder(t *testing.T) {
	t.Parallel()
	_, b, conn, all := quorumPoisonQueueOf(t, "clirb", 400, func(i int) amqp.Table {
		return amqp.Table{sluice.EventTypeKey: []string{"order.kept", "order.moved"}[i%2]}
	})
	var kept, moved []string
	for i, body := range all {
		if i%2 == 1 {
			moved = append(moved, body)
		} else {
			kept = append(kept, body)
		}
	}
	ch, err := conn.Channel()
	require.NoError(t, err)
	target := testenv.Name("clirb-to")
	_, err = ch.QueueDeclare(target, true, false, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = ch.QueueDelete(target, false, false, false) })
	poisonQ := b.topo.Config().PoisonQueue
	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", poisonQ, "--event-type", "order.moved", "--to", target, "--batch", "100")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "200", out)
	left := bodiesOf(t, conn, poisonQ)
	require.Equal(t, kept, left, "what the replay left is in its order: %d of %d out of order", outOfOrder(kept, left), len(kept))
	require.Equal(t, moved, bodiesOf(t, conn, target), "what it replayed went in order")
}

// quorumPoisonQueueOf is a bed on the package's private node whose quorum
// poison queue holds n messages, m0000 onwards, with headers(i) when not
// nil, and a connection to the node; it returns their bodies in order.
func quorumPoisonQueueOf(t *testing.T, prefix string, n int, headers func(int) amqp.Table) (*testenv.PrivateRabbitMQ, *bed, *amqp.Connection, []string) {
	t.Helper()
	node, _ := privateNode(t)
	b := newBedAt(t, node.URL, rabbitmq.TopologyConfig{Queue: testenv.Name(prefix), TierDelays: []time.Duration{time.Minute}, Quorum: true, DeliveryLimit: 5})
	conn, err := amqp.Dial(node.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	pub := testenv.Confirm(t, ch)
	var bodies []string
	var msgs []amqp.Publishing
	for i := range n {
		m := amqp.Publishing{Body: fmt.Appendf(nil, "m%04d", i)}
		if headers != nil {
			m.Headers = headers(i)
		}
		bodies = append(bodies, string(m.Body))
		msgs = append(msgs, m)
	}
	require.NoError(t, pub.PublishAll(t.Context(), b.topo.Config().PoisonQueue, msgs))
	return node, b, conn, bodies
}

// bodiesOf drains queue and returns its messages' bodies in order.
func bodiesOf(t *testing.T, conn *amqp.Connection, queue string) []string {
	t.Helper()
	var out []string
	for _, d := range testenv.Drain(t, conn, queue) {
		out = append(out, string(d.Body))
	}
	return out
}

// outOfOrder is how many of got are out of want's order: how many would
// have to move — len(got) less its longest run, not necessarily
// contiguous, in want's order. What a failed order check prints.
func outOfOrder(want, got []string) int {
	pos := make(map[string]int, len(want))
	for i, w := range want {
		pos[w] = i
	}
	var tails []int // tails[k]: the least last position of a run of k+1
	for _, g := range got {
		p, ok := pos[g]
		if !ok {
			continue
		}
		k, _ := slices.BinarySearch(tails, p)
		if k == len(tails) {
			tails = append(tails, p)
		} else {
			tails[k] = p
		}
	}
	return len(got) - len(tails)
}
