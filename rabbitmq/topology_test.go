package rabbitmq_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// newTopology declares a topology for a queue of t's own and deletes its
// queues when t ends.
func newTopology(t *testing.T, cfg rabbitmq.TopologyConfig) *rabbitmq.Topology {
	t.Helper()
	if cfg.Queue == "" {
		cfg.Queue = testenv.Name("q")
	}
	topo, err := rabbitmq.NewTopology(cfg)
	require.NoError(t, err)
	var names []string
	for _, q := range topo.Queues() { // every queue of a jittered tier too
		names = append(names, q.Name)
	}
	if cfg.Exchange != "" {
		names = append(names, "exchange:"+cfg.Exchange)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	conn := testenv.AMQP(t)
	_, err = topo.Declare(t.Context(), conn)
	require.NoError(t, err)
	_, err = topo.Declare(t.Context(), conn)
	require.NoError(t, err, "Declare is idempotent")
	return topo
}

func TestTopologyTiersReturnToTheQueue(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) {
			t.Parallel()
			topo := newTopology(t, rabbitmq.TopologyConfig{TierDelays: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}, Quorum: quorum})
			conn := testenv.AMQP(t)
			p := newPublisher(t, "")
			for _, tier := range topo.Tiers() {
				require.NoError(t, p.Publish(tier.Topic, msgs(1)...))
			}
			require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, topo.Config().Queue) == 2 }, time.Minute, 20*time.Millisecond,
				"each tier's copy expires back into the queue")
			for _, tier := range topo.Tiers() {
				require.Zero(t, testenv.QueueDepth(t, conn, tier.Topic))
			}
			got := testenv.Drain(t, conn, topo.Config().Queue)
			msg, err := rabbitmq.Marshaler{}.Unmarshal(got[0])
			require.NoError(t, err)
			require.Equal(t, "1", msg.Metadata.Get(metakeys.DeathCount))
			require.Equal(t, "expired", msg.Metadata.Get(metakeys.FirstDeathReason))
		})
	}
}

func TestTopologyQuorumDeliveryLimitDeadLettersToPoison(t *testing.T) {
	t.Parallel()
	topo := newTopology(t, rabbitmq.TopologyConfig{Quorum: true, DeliveryLimit: 2, TierDelays: []time.Duration{time.Second}})
	conn := testenv.AMQP(t)
	require.NoError(t, newPublisher(t, "").Publish(topo.Config().Queue, msgs(1)...))

	// A consumer that crashes on the message: nack with requeue, again and again.
	ch := testenv.Channel(t, conn)
	deliveries, err := ch.Consume(topo.Config().Queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	deadline := time.After(time.Minute)
	for n := 0; testenv.QueueDepth(t, conn, topo.Config().PoisonQueue) == 0; n++ {
		select {
		case d := <-deliveries:
			require.NoError(t, d.Nack(false, true))
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("the delivery limit did not dead-letter the message to the poison queue")
		}
	}
	require.Equal(t, 1, testenv.QueueDepth(t, conn, topo.Config().PoisonQueue))
}

func TestTopologyOnlyQueueReceivesRetryCopies(t *testing.T) {
	t.Parallel()
	ex := testenv.Name("ex")
	topo := newTopology(t, rabbitmq.TopologyConfig{Exchange: ex, BindingKey: "orders.created", TierDelays: []time.Duration{100 * time.Millisecond}})
	conn := testenv.AMQP(t)
	other := declareQueue(t, "other")
	require.NoError(t, testenv.Channel(t, conn).QueueBind(other, "orders.created", ex, false, nil))

	require.NoError(t, newPublisher(t, ex).Publish("orders.created", msgs(1)...))
	require.NoError(t, newPublisher(t, "").Publish(topo.Tiers()[0].Topic, msgs(1)...))
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, topo.Config().Queue) == 2 }, time.Minute, 20*time.Millisecond)
	require.Equal(t, 1, testenv.QueueDepth(t, conn, other), "the expired copy went to the queue only, not through the exchange")
}

func TestTopologyConflictNamesTheArgument(t *testing.T) {
	t.Parallel()
	q := testenv.Name("conflict")
	conn := testenv.AMQP(t)
	ch := testenv.Channel(t, conn)
	testenv.DeleteQueuesAtEnd(t, q+".retry.30s")
	_, err := ch.QueueDeclare(q+".retry.30s", true, false, false, false, amqp.Table{"x-message-ttl": int64(1000)})
	require.NoError(t, err)

	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: q, TierDelays: []time.Duration{30 * time.Second}})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, q, q+".poison")
	_, err = topo.Declare(t.Context(), conn)
	var ce *rabbitmq.ConflictError
	require.True(t, errors.As(err, &ce), "got %v", err)
	require.Equal(t, q+".retry.30s", ce.Name)
	require.Equal(t, "x-message-ttl", ce.Argument)
	require.Contains(t, err.Error(), "x-message-ttl is one a policy can set")
	require.Contains(t, err.Error(), "sluice topology migrate")
}

// A classic queue (as watermill-amqp declares it) under a quorum topology:
// the conflict says a policy cannot change the type and points at the
// migration.
func TestTopologyConflictOnTheQueueType(t *testing.T) {
	t.Parallel()
	q := testenv.Name("conflict_type")
	conn := testenv.AMQP(t)
	testenv.DeleteQueuesAtEnd(t, q, q+".poison", q+".retry.30s")
	_, err := testenv.Channel(t, conn).QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)

	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: q, TierDelays: []time.Duration{30 * time.Second}, Quorum: true})
	require.NoError(t, err)
	_, err = topo.Declare(t.Context(), conn)
	ce, ok := errors.AsType[*rabbitmq.ConflictError](err)
	require.True(t, ok, "got %v", err)
	require.Equal(t, "x-queue-type", ce.Argument, ce.Detail)
	require.Contains(t, err.Error(), "x-queue-type cannot be set by a policy")
	require.Contains(t, err.Error(), "sluice topology migrate")
	require.NotContains(t, err.Error(), "move it with a policy")
}

func TestTopologyPolicies(t *testing.T) {
	t.Parallel()
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: "orders", Quorum: true, DeliveryLimit: 20})
	require.NoError(t, err)
	got := strings.Join(topo.Plan().Policies, "\n")
	require.Equal(t, `# declare orders, its tiers and orders.poison with x-queue-type=quorum: a policy cannot set the queue type
rabbitmqctl set_policy --apply-to queues --priority 10 sluice-orders '^orders$' '{"dead-letter-exchange":"","dead-letter-routing-key":"orders.poison","dead-letter-strategy":"at-least-once","delivery-limit":20,"overflow":"reject-publish"}'
rabbitmqctl set_policy --apply-to queues --priority 10 sluice-orders-retry-30s '^orders\.retry\.30s$' '{"dead-letter-exchange":"","dead-letter-routing-key":"orders","dead-letter-strategy":"at-least-once","message-ttl":30000,"overflow":"reject-publish"}'
rabbitmqctl set_policy --apply-to queues --priority 10 sluice-orders-retry-5m '^orders\.retry\.5m$' '{"dead-letter-exchange":"","dead-letter-routing-key":"orders","dead-letter-strategy":"at-least-once","message-ttl":300000,"overflow":"reject-publish"}'
rabbitmqctl set_policy --apply-to queues --priority 10 sluice-orders-retry-30m '^orders\.retry\.30m$' '{"dead-letter-exchange":"","dead-letter-routing-key":"orders","dead-letter-strategy":"at-least-once","message-ttl":1800000,"overflow":"reject-publish"}'
rabbitmqctl set_policy --apply-to queues --priority 10 sluice-orders-poison '^orders\.poison$' '{"delivery-limit":2147483647}'`, got)
}

func TestNewTopologyValidates(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  rabbitmq.TopologyConfig
		want string
	}{
		{rabbitmq.TopologyConfig{}, "TopologyConfig.Queue"},
		{rabbitmq.TopologyConfig{Queue: "amq.x"}, "TopologyConfig.Queue"},
		{rabbitmq.TopologyConfig{Queue: "has space"}, "TopologyConfig.Queue"},
		{rabbitmq.TopologyConfig{Queue: "q", PoisonQueue: "q"}, "TopologyConfig.PoisonQueue"},
		{rabbitmq.TopologyConfig{Queue: "q", DeliveryLimit: 5}, "TopologyConfig.DeliveryLimit"},
		{rabbitmq.TopologyConfig{Queue: "q", TierDelays: []time.Duration{time.Second, time.Second}}, "TopologyConfig.TierDelays"},
		{rabbitmq.TopologyConfig{Queue: "q", TierDelays: []time.Duration{0}}, "TopologyConfig.TierDelays"},
		{rabbitmq.TopologyConfig{Queue: "q", TierDelays: []time.Duration{30 * 24 * time.Hour}}, "TopologyConfig.TierDelays"},
	} {
		_, err := rabbitmq.NewTopology(tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
}

// Config is the configuration with its defaults filled, and a copy.
func TestTopologyConfigFillsItsDefaults(t *testing.T) {
	t.Parallel()
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: "orders", Exchange: "events", TierJitter: broker.Jitter{Fraction: 0.2}})
	require.NoError(t, err)
	cfg := topo.Config()
	require.Equal(t, rabbitmq.TopologyConfig{Queue: "orders", PoisonQueue: "orders.poison", TierDelays: []time.Duration{30 * time.Second, 5 * time.Minute, 30 * time.Minute},
		TierJitter: broker.Jitter{Fraction: 0.2, Queues: 4}, Exchange: "events", ExchangeType: "topic", BindingKey: "orders"}, cfg)
	cfg.TierDelays[0] = time.Hour
	require.Equal(t, 30*time.Second, topo.Config().TierDelays[0], "a copy")

	parted, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: "ledger", Partitions: 2, PartitionKey: "account", TierDelays: []time.Duration{time.Minute}})
	require.NoError(t, err)
	require.Equal(t, rabbitmq.TopologyConfig{Queue: "ledger", PoisonQueue: "ledger.poison", TierDelays: []time.Duration{time.Minute},
		Exchange: "ledger", ExchangeType: "x-consistent-hash", Partitions: 2, PartitionKey: "account"}, parted.Config())
	require.Equal(t, "ledger.p1", parted.Partitions()[1].Config().Queue)
	require.Equal(t, "ledger.poison", parted.Partitions()[1].Config().PoisonQueue)
}

// Plan lists each queue with its arguments and its binding to the
// exchange, the exchange's arguments and the policy lines.
func TestTopologyPlan(t *testing.T) {
	t.Parallel()
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: "orders", Exchange: "events", BindingKey: "orders.#", TierDelays: []time.Duration{time.Minute}})
	require.NoError(t, err)
	require.Equal(t, rabbitmq.Plan{ExchangeArguments: "{}", Queues: []rabbitmq.Declaration{
		{Name: "orders", Arguments: "{}", BindingKey: "orders.#"},
		{Name: "orders.retry.1m", Arguments: `{"x-dead-letter-exchange":"","x-dead-letter-routing-key":"orders","x-message-ttl":60000}`},
		{Name: "orders.poison", Arguments: "{}"},
	}, Policies: []string{
		`rabbitmqctl set_policy --apply-to queues --priority 10 sluice-orders-retry-1m '^orders\.retry\.1m$' '{"dead-letter-exchange":"","dead-letter-routing-key":"orders","message-ttl":60000}'`,
	}}, topo.Plan())

	parted, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: "ledger", Partitions: 2, PartitionKey: "account", TierDelays: []time.Duration{time.Minute}})
	require.NoError(t, err)
	plan := parted.Plan()
	require.Equal(t, `{"hash-header":"account"}`, plan.ExchangeArguments)
	var bound []string
	for _, q := range plan.Queues {
		if q.BindingKey != "" {
			bound = append(bound, q.Name+" "+q.BindingKey)
		}
	}
	require.Equal(t, []string{"ledger.p0 1", "ledger.p1 1"}, bound)
}
