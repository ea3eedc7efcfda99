package rabbitmq_test

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A quorum poison queue is declared with a delivery limit no reading
// reaches (so RabbitMQ keeps what a reader returns at its head, in order,
// and 4.x's default of 20 cannot drop it); a classic one with none.
func TestPoisonQueueDeliveryLimitIsDeclared(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: "orders", Quorum: quorum, TierDelays: []time.Duration{time.Second}})
		require.NoError(t, err)
		decl := topo.Plan().Queues
		poison := decl[len(decl)-1]
		require.Equal(t, "orders.poison", poison.Name)
		if quorum {
			require.Equal(t, `{"x-delivery-limit":2147483647,"x-queue-type":"quorum"}`, poison.Arguments)
		} else {
			require.Equal(t, `{}`, poison.Arguments)
		}
	}
}

// A quorum poison queue declared before Sluice gave it a delivery limit is
// kept as it is — a declared argument cannot change — and Apply names the
// policy that gives it the limit; Declare succeeds, as it did.
func TestApplyNamesThePolicyForAnOldQuorumPoisonQueue(t *testing.T) {
	t.Parallel()
	q := testenv.Name("oldpoison")
	conn := testenv.AMQP(t)
	testenv.DeleteQueuesAtEnd(t, q, q+".poison", q+".retry.1s")
	_, err := testenv.Channel(t, conn).QueueDeclare(q+".poison", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)

	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: q, Quorum: true, DeliveryLimit: 5, TierDelays: []time.Duration{time.Second}})
	require.NoError(t, err)
	todo, err := topo.Declare(t.Context(), conn)
	require.NoError(t, err)
	require.Len(t, todo, 1)
	require.Contains(t, todo[0], q+".poison exists without x-delivery-limit")
	require.Contains(t, todo[0], `rabbitmqctl set_policy --apply-to queues --priority 10 sluice-`+strings.ReplaceAll(q, ".", "-")+`-poison`)
	require.Contains(t, todo[0], `'{"delivery-limit":2147483647}'`)
	_, err = topo.Declare(t.Context(), conn)
	require.NoError(t, err, "an old poison queue does not stop a consumer from starting")

	fresh, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: testenv.Name("newpoison"), Quorum: true, TierDelays: []time.Duration{time.Second}})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, fresh.Config().Queue, fresh.Config().PoisonQueue, fresh.Tiers()[0].Topic)
	todo, err = fresh.Declare(t.Context(), conn)
	require.NoError(t, err)
	require.Empty(t, todo, "a queue Sluice declares has the limit")
}
