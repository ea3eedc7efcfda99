package main

import (
	"errors"
	"fmt"
	"strings"
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
// messages. Before: inspect listed none and stats counted 0 — the scan read
// as many messages as the count said.
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

	stalled := stallUntilRead(t, node, poisonQ)
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
	stalled()

	stalled = stallUntilRead(t, node, poisonQ)
	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", poisonQ)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "5 messages", out)
	stalled()
}

// stallUntilRead suspends the Ra server that leads the quorum queue on node
// (in node's vhost) until a basic.get's dequeue command is in its mailbox
// (or a minute passed), as a leader too slow to answer within 250 ms. The
// function it returns waits until the server runs again.
func stallUntilRead(t *testing.T, node *testenv.PrivateRabbitMQ, queue string) func() {
	t.Helper()
	vhost := node.URL[strings.LastIndex(node.URL, "/")+1:]
	server := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<%q>>, queue, <<%q>>)), {Name, _} = amqqueue:get_pid(Q), P = whereis(Name)`, vhost, queue)
	node.Ctl(t, "eval", server+`,
		ok = sys:suspend(P),
		spawn(fun() ->
			Read = fun R(0) -> ok;
			           R(N) -> {messages, Ms} = erlang:process_info(P, messages),
			                   case string:find(lists:flatten(io_lib:format("~p", [Ms])), "dequeue") of
			                       nomatch -> timer:sleep(10), R(N - 1);
			                       _ -> ok
			                   end
			       end,
			Read(6000),
			sys:resume(P)
		end),
		ok.`)
	return func() {
		t.Helper()
		require.Eventually(t, func() bool {
			out, err := node.NodeCtl()(t.Context(), "eval", server+`, {status, _, _, [_, S | _]} = sys:get_status(P, 5000), S.`)
			return err == nil && strings.TrimSpace(out) == "running"
		}, 2*time.Minute, 100*time.Millisecond, "the queue's Ra server runs again")
	}
}
