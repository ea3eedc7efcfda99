package router_test

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
)

// TestHungDatabaseBehindWatermillOnAQuorumQueue is the stack as users
// compose it — Watermill's Retry and Timeout on the router, every Sluice
// stage, the SQL inbox with its default probe, a quorum queue with a
// delivery limit — meeting a database that hangs instead of refusing: a
// proxy black-holes PostgreSQL mid-run (the default DSN, no
// connect_timeout). No handler freezes: the store's calls are given up, the
// brake engages and probes the database with the inbox's Ping; once the
// network heals every event is committed exactly once, none dead-lettered by
// the broker, none poisoned.
func TestHungDatabaseBehindWatermillOnAQuorumQueue(t *testing.T) {
	t.Parallel()
	const events, before = 100, 20
	admin := testenv.Postgres(t)
	schema := testenv.Schema(t, admin)
	_, err := admin.Exec(`CREATE TABLE ` + schema + `.effects (event_id TEXT PRIMARY KEY)`)
	require.NoError(t, err)
	testenv.SQLStore(t, admin, schema+".inbox")
	committed := func() (n int) {
		require.NoError(t, admin.Get(&n, `SELECT count(*) FROM `+schema+`.effects`))
		return n
	}

	u, err := url.Parse(testenv.PostgresURL)
	require.NoError(t, err)
	proxy := testenv.StartProxy(t, u.Host)
	u.Host = proxy.Addr()
	db, err := sqlx.Open("postgres", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(32)
	store, err := sqlstore.New(sqlstore.Config{DB: db, Table: schema + ".inbox"})
	require.NoError(t, err)

	queue := testenv.Name("hung")
	q := newQuorumRabbitMQ(t, queue, 200*time.Millisecond, 400*time.Millisecond)
	reader := sdkmetric.NewManualReader()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(
		wmiddleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond, Logger: watermill.NopLogger{}}.Middleware,
		wmiddleware.Timeout(5*time.Second),
	)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "effects",
		Handler: func(msg *message.Message) error {
			_, err := sqlstore.TxFromContext(msg.Context()).ExecContext(msg.Context(),
				`INSERT INTO `+schema+`.effects (event_id) VALUES ($1)`, msg.Metadata.Get(sluice.EventIDKey))
			return err
		},
		Stages: router.Stages{
			Poison:        &poison.Config{PublishBackoff: 50 * time.Millisecond},
			Retry:         &retrytiers.Config{PublishBackoff: 50 * time.Millisecond},
			Brake:         &brake.Config{Window: 20, CoolDown: 50 * time.Millisecond, MaxCoolDown: 200 * time.Millisecond, ProbeTimeout: 300 * time.Millisecond, Match: brake.MatchUnreachable},
			Classify:      &middleware.ClassifyConfig{},
			Inbox:         &deduplication.Config{Store: store, Consumer: "effects", StoreTimeout: 300 * time.Millisecond},
			Recoverer:     &middleware.RecovererConfig{},
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		},
	})
	require.NoError(t, err)
	runRouter(t, r)

	for i := range events {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("evt-%03d", i))
		m.Metadata.Set("sluice_attempt", "999999999") // a producer's forgery: not believed
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	require.Eventually(t, func() bool { return committed() >= before }, time.Minute, 5*time.Millisecond)
	proxy.BlackHole()
	failedPings := func() int64 {
		return testenv.CounterWhere(t, reader, brake.MetricProbes, string(brake.AttrProbe), "dependency") -
			testenv.CounterWhere(t, reader, brake.MetricProbes, string(brake.AttrProbeResult), "passed")
	}
	require.Eventually(t, func() bool { return failedPings() >= 5 }, time.Minute, 10*time.Millisecond,
		"the brake engages on the given-up store calls and probes the database")
	proxy.Heal()

	conn := testenv.AMQP(t)
	deadLettered := func() int { return testenv.QueueDepth(t, conn, q.Topology().PoisonQueue()) }
	require.Eventually(t, func() bool { return committed()+deadLettered() == events }, 2*time.Minute, 20*time.Millisecond,
		"every event committed once the network heals")
	require.Zero(t, deadLettered(), "no message dead-lettered by the broker")
	require.Zero(t, testenv.CounterSum(t, reader, poison.MetricPoisoned))
	require.Zero(t, testenv.CounterSum(t, reader, retrytiers.MetricExhausted))
	require.Equal(t, events, committed(), "each effect once (the table's primary key)")
	var claims int
	require.NoError(t, admin.Get(&claims, `SELECT count(*) FROM `+schema+`.inbox`))
	require.Equal(t, events, claims)
}
