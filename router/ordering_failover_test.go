package router_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/postgres"
)

// Single active consumer failover mid-release (issue 34): instance A owns
// the partition; key acct-1's message 1 fails once and goes to a tier, so
// messages 2–5 are held; its copy comes back, succeeds, and A releases the
// held messages — and dies (its broker and database connections cut, none
// can be opened again) while message 3 runs. Instance B, the partition's
// standby consumer, becomes its owner and continues the release: the
// effects are 0 1 2 3 4 5, each once, in order.
func TestAPartitionsNextOwnerContinuesAReleaseInOrder(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s.applied (n bigserial PRIMARY KEY, seq int NOT NULL)`, schema))
	require.NoError(t, err)
	testenv.SQLStore(t, db, schema+".inbox")
	orders := testenv.Migrate(t, db, sluicesql.Config{Schema: schema, Order: sluicesql.OrdersConfig{TablePrefix: "order"}}).Order

	tc := rabbitmq.TopologyConfig{Queue: testenv.Name("failover"), TierDelays: []time.Duration{100 * time.Millisecond},
		Partitions: 1, PartitionKey: "account"}
	topo, err := rabbitmq.NewTopology(tc)
	require.NoError(t, err)
	names := []string{"exchange:" + topo.Config().Exchange}
	for _, q := range topo.Queues() {
		names = append(names, q.Name)
	}
	testenv.DeleteQueuesAtEnd(t, names...)

	// start runs an instance of the consumer on its own broker connection
	// and pool; hold, when set, is called before each message's effect.
	start := func(amqpURL string, pool *sqlx.DB, hold func(seq int)) (b *rabbitmq.Broker, stop func() error) {
		b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: amqpURL}, Topology: tc})
		require.NoError(t, err)
		inbox, err := sluicesql.NewInbox(pool, sluicesql.InboxConfig{Table: schema + ".inbox"})
		require.NoError(t, err)
		store, err := sluicesql.NewOrders(pool, sluicesql.OrdersConfig{TablePrefix: schema + ".order"})
		require.NoError(t, err)
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		require.NoError(t, err)
		_, err = router.Add(r, router.HandlerConfig{
			Broker: b, Name: "ledger",
			Handler: seqEffect(schema, 1, hold),
			Stages: router.Stages{
				Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
				Inbox:     &deduplication.Config{Store: inbox},
				Recoverer: &stage.RecovererConfig{},
				Order:     &ordering.Config{Store: store, Key: sluice.KeyFromMetadata("account"), ResumeInterval: 100 * time.Millisecond},
			},
		})
		require.NoError(t, err)
		done := testenv.RunRouter(context.Background(), r)
		var once sync.Once
		var closeErr error
		return b, func() error {
			once.Do(func() { closeErr = r.Close(); <-done; _ = b.Close() })
			return closeErr
		}
	}

	// A, through proxies that can cut it off.
	amqpProxy, amqpURL := testenv.ProxyAMQP(t)
	pgProxy, dsn := testenv.ProxyPostgresURL(t)
	poolA, err := postgres.Open(postgres.Config{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = poolA.Close() })
	midRelease, resume := make(chan struct{}), make(chan struct{})
	var mid sync.Once
	brokerA, stopA := start(amqpURL, poolA, func(seq int) {
		if seq == 3 {
			mid.Do(func() { close(midRelease) })
			<-resume
		}
	})
	t.Cleanup(func() { _ = stopA() })
	for seq := range 6 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("acct-1-%d", seq))
		m.Metadata.Set("account", "acct-1")
		m.Metadata.Set("seq", fmt.Sprint(seq))
		require.NoError(t, brokerA.PartitionPublisher().Publish(topo.Config().Exchange, m))
	}
	applied := func() []int {
		var s []int
		require.NoError(t, db.Select(&s, fmt.Sprintf(`SELECT seq FROM %s.applied ORDER BY n`, schema)))
		return s
	}
	select {
	case <-midRelease:
	case <-time.After(time.Minute):
		t.Fatalf("A did not reach message 3 of the release; applied %v", applied())
	}
	require.Equal(t, []int{0, 1, 2}, applied(), "A released 2 and runs 3")

	// B attaches as the partition's standby consumer; then A dies: its
	// connections are cut and none can be opened again, its handler never
	// returns (until the end: below).
	_, stopB := start(testenv.AMQPURL, db, nil)
	t.Cleanup(func() { require.NoError(t, stopB()) })
	for _, p := range []*testenv.Proxy{amqpProxy, pgProxy} {
		p.BlackHole()
		p.Reset()
	}

	require.Eventually(t, func() bool { return len(applied()) >= 6 }, time.Minute, 20*time.Millisecond,
		"B continues the release; applied %v", applied)
	require.Equal(t, []int{0, 1, 2, 3, 4, 5}, applied(), "each once, in order")
	require.Eventually(t, func() bool { // each held row is removed after its message's commit
		keys, err := orders.Keys(t.Context(), "ledger-p0", 10)
		require.NoError(t, err)
		return len(keys) == 0
	}, time.Minute, 20*time.Millisecond, "nothing held")

	// A's leftovers, after the checks: B stopped, A's network back, its
	// handler returns (its effect of 3 meets a closed connection), and A
	// closes in time.
	require.NoError(t, stopB())
	amqpProxy.Heal()
	pgProxy.Heal()
	close(resume)
	_ = stopA()
}
