package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// declareLadder declares queue's topology with tiers on amqpURL.
func declareLadder(t *testing.T, amqpURL, queue string, tiers ...time.Duration) {
	t.Helper()
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: amqpURL}, "test")
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: queue, TierDelays: tiers})
	require.NoError(t, err)
	_, err = topo.Declare(t.Context(), conn)
	require.NoError(t, err)
}

// With the management API, a family's ladder is the broker's: `sluice
// queues --queue orders` and the console's families show the tiers orders
// was declared with (2s, 4s, 8s), without --tiers. Before, both took the
// library's default ladder and showed orders.retry.{30s,5m,30m} missing.
func TestTheLadderIsReadFromTheBroker(t *testing.T) {
	t.Parallel()
	node, _ := privateNode(t)
	declareLadder(t, node.URL, "orders", 2*time.Second, 4*time.Second, 8*time.Second)

	var out, errOut strings.Builder
	code := run([]string{"--amqp-url", node.URL, "queues", "--queue", "orders", "--management-url", node.ManagementURL, "--json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r queueRow
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		require.False(t, r.Missing, r.Queue)
		got = append(got, r.Queue+" "+r.Role)
	}
	require.Equal(t, []string{"orders main", "orders.retry.2s tier 2s", "orders.retry.4s tier 4s", "orders.retry.8s tier 8s", "orders.poison poison"}, got)

	lf := ladderFlags{tiers: "30s,5m,30m"}
	out.Reset()
	qs, err := consoleQueues(&globals{amqpURL: node.URL}, &lf, []string{"orders"}, node.ManagementURL, &out)
	require.NoError(t, err)
	require.Len(t, qs, 1)
	require.Equal(t, []string{"orders.retry.2s", "orders.retry.4s", "orders.retry.8s"}, qs[0].Tiers)
	require.Equal(t, "orders.poison", qs[0].Poison)
	require.Empty(t, out.String())
}

// Without the management API, AMQP cannot list the tiers: a family whose
// main queue exists with none of the default ladder's tiers is said to
// have another ladder, with the two ways to show it. Before, its tiers
// were listed "missing" and nothing more.
func TestAnotherLadderIsSaidWithoutTheManagementAPI(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("ladder")
	testenv.DeleteQueuesNowAndAtEnd(t, queue, queue+".retry.2s", queue+".poison")
	declareLadder(t, testenv.AMQPURL, queue, 2*time.Second)
	var out, errOut strings.Builder
	code := run([]string{"--amqp-url", testenv.AMQPURL, "queues", "--queue", queue}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Contains(t, out.String(), queue+" has none of the tiers of the ladder 30s,5m,30m: it was declared with another one")
	require.Contains(t, out.String(), "--management-url")

	out.Reset()
	code = run([]string{"--amqp-url", testenv.AMQPURL, "queues", "--queue", queue, "--tiers", "2s"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.NotContains(t, out.String(), "missing")
	require.NotContains(t, out.String(), "another one")
}
