package main

import (
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// newQuorumBed is newBed on a quorum topology.
func newQuorumBed(t *testing.T, deliveryLimit int) *bed {
	t.Helper()
	return newBedOn(t, rabbitmq.TopologyConfig{Queue: testenv.Name("cliq"), TierDelays: []time.Duration{time.Minute}, Quorum: true, DeliveryLimit: deliveryLimit})
}

var shownEvent = regexp.MustCompile(`\(event (e\d+)\)`)

// TestInspectingAQuorumPoisonQueueKeepsItsOrder looks at a quorum poison
// queue six times — inspect with limits, inspect all, stats — each run a
// CLI of its own, right after the one before: the queue keeps its order and
// every message, and each look costs at most one delivery per message it
// read. Before: a look that read ten messages or more left them returned in
// the order of their delivery tags as text (1, 10, 11, 12, 2, …, RabbitMQ
// 3.x's consumer keys), a look that stopped among messages returned before
// moved them behind the rest, and a channel's close returned the messages
// only after the next run may have read past them (ev3 ev4 ev1 ev2).
func TestInspectingAQuorumPoisonQueueKeepsItsOrder(t *testing.T) {
	t.Parallel()
	b := newQuorumBed(t, 5)
	const n = 12
	var want []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprint("e", i)
		want = append(want, id)
		b.poisoned(t, id, "order.created", sluice.Poison(errors.New("bad")))
	}
	poisonQ := b.topo.Config().PoisonQueue
	looks := []struct {
		args  []string
		shown []string
	}{
		{[]string{"dlq", "inspect", "--queue", poisonQ, "--limit", "2"}, want[:2]},
		{[]string{"dlq", "inspect", "--queue", poisonQ, "--limit", "2"}, want[:2]},
		{[]string{"dlq", "inspect", "--queue", poisonQ, "--limit", "1"}, want[:1]},
		{[]string{"dlq", "inspect", "--queue", poisonQ}, want},
		{[]string{"dlq", "stats", "--queue", poisonQ}, nil},
		{[]string{"dlq", "inspect", "--queue", poisonQ, "--limit", "3"}, want[:3]},
	}
	for i, l := range looks {
		code, out, errOut := b.cli(t, l.args...)
		require.Equal(t, 0, code, errOut)
		if l.shown != nil {
			var shown []string
			for _, m := range shownEvent.FindAllStringSubmatch(out, -1) {
				shown = append(shown, m[1])
			}
			require.Equal(t, l.shown, shown, "look %d shows the head of the queue, in order", i+1)
		} else {
			require.Contains(t, out, fmt.Sprintf("%d messages", n))
		}
	}

	got := testenv.Drain(t, testenv.AMQP(t), poisonQ)
	var order []string
	counts := map[string]any{}
	for _, d := range got {
		id := fmt.Sprint(d.Headers[sluice.EventIDKey])
		order = append(order, id)
		counts[id] = d.Headers["x-delivery-count"]
		c, ok := d.Headers["x-delivery-count"].(int64)
		require.True(t, ok, "a quorum queue counts deliveries: %v", d.Headers["x-delivery-count"])
		require.LessOrEqual(t, c, int64(len(looks)), "%s: at most one delivery counted per look", id)
	}
	require.Equal(t, want, order, "six looks later the poison queue holds every message, in its order")
	t.Logf("x-delivery-count after %d looks (RabbitMQ %s): %v", len(looks), serverVersion(t), counts)
}

// serverVersion is the test broker's version, for the logs.
func serverVersion(t *testing.T) string {
	return fmt.Sprint(testenv.AMQP(t).Properties["version"])
}

// `sluice topology plan` shows the poison queue's delivery limit, and
// `apply` on a quorum poison queue declared before it had one keeps the
// queue and prints the policy that gives it the limit.
func TestTopologyApplyShowsThePoisonQueueLimit(t *testing.T) {
	t.Parallel()
	q := testenv.Name("topoq")
	code, out, errOut := (&bed{}).cli(t, "topology", "plan", "--queue", q, "--tiers", "1s", "--quorum")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, q+`.poison {"x-delivery-limit":2147483647,"x-queue-type":"quorum"}`)
	require.Contains(t, out, `'{"delivery-limit":2147483647}'`)

	testenv.DeleteQueuesAtEnd(t, q, q+".poison", q+".retry.1s")
	_, err := testenv.Channel(t, testenv.AMQP(t)).QueueDeclare(q+".poison", true, false, false, false, map[string]any{"x-queue-type": "quorum"})
	require.NoError(t, err)
	code, out, errOut = (&bed{}).cli(t, "topology", "apply", "--queue", q, "--tiers", "1s", "--quorum")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "declared "+q+".poison")
	require.Contains(t, out, "to do: "+q+".poison exists without x-delivery-limit")
	require.Contains(t, out, `'{"delivery-limit":2147483647}'`)
}

// A quorum poison queue declared before Sluice gave it a delivery limit
// (RabbitMQ 3.x: none) requeues what a look puts back at its tail: a look
// that stops early reads on to the end, so that the order stays. Before
// (with the nacks alone): the second `--limit 2` showed e3 e4.
func TestInspectingAnOldQuorumPoisonQueueKeepsItsOrder(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	pq := testenv.Name("oldq") + ".poison"
	testenv.DeleteQueuesAtEnd(t, pq)
	_, err := testenv.Channel(t, testenv.AMQP(t)).QueueDeclare(pq, true, false, false, false, map[string]any{"x-queue-type": "quorum"})
	require.NoError(t, err)
	var want []string
	for i := 1; i <= 6; i++ {
		id := fmt.Sprint("e", i)
		want = append(want, id)
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(sluice.EventIDKey, id)
		require.NoError(t, b.pub.Publish(pq, m))
	}
	for _, limit := range []string{"2", "2", "1", "4"} {
		code, out, errOut := b.cli(t, "dlq", "inspect", "--queue", pq, "--limit", limit)
		require.Equal(t, 0, code, errOut)
		var shown []string
		for _, m := range shownEvent.FindAllStringSubmatch(out, -1) {
			shown = append(shown, m[1])
		}
		n := map[string]int{"1": 1, "2": 2, "4": 4}[limit]
		require.Equal(t, want[:n], shown, "inspect --limit %s", limit)
	}
	require.Equal(t, want, ids(t, pq))
}
