package service_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicesql/postgres"
)

// Issue 43, item 4: a service on a lib/pq pool that sqlx.Open returned
// says, when it is built, that the pool may not recover from a network
// fault that swallows packets — the service stopped consuming for
// good after a black hole healed without resets, /readyz 503 and /livez
// 200 — and names the remedy, postgres.Open. A pool postgres.Open returned
// is not warned about. Before, nothing was said.
func TestAServiceWarnsOfAPoolThatMayNotRecover(t *testing.T) {
	t.Parallel()
	plain, err := sqlx.Open("postgres", testenv.PostgresURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	bounded, err := postgres.Open(postgres.Config{DSN: testenv.PostgresURL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bounded.Close() })
	schema := testenv.Schema(t, testenv.Postgres(t))
	for _, c := range []struct {
		name string
		db   *sqlx.DB
		warn bool
	}{{"sqlx.Open", plain, true}, {"postgres.Open", bounded, false}} {
		var logs testenv.SyncBuffer
		r := newRouter(t, watermill.NewStdLoggerWithOut(&logs, false, false))
		_, err := service.New(service.Config{DB: c.db, Schema: schema, Router: r})
		require.NoError(t, err, c.name)
		if !c.warn {
			require.NotContains(t, logs.String(), "may not recover", c.name)
			require.Empty(t, service.StallRisk(c.db), c.name)
			continue
		}
		require.Contains(t, logs.String(), "a database pool that may not recover from a network fault", c.name)
		require.Contains(t, logs.String(), "open it with postgres.Open", c.name)
		require.NotEmpty(t, service.StallRisk(c.db), c.name)
	}
}

// The remedy the warning names, under the fault: a service on
// postgres.Open's pool behind a proxy that black-holes PostgreSQL, then
// heals for new connections only (the caught ones stay stalled). /readyz
// fails while the hole lasts (its brake engaged) and passes again after the
// heal, /livez passes throughout (a restart would not help), every event is
// processed and every row it produced relayed, and Close returns within its
// bound: DrainTimeout, plus the relay's and the router's own.
func TestAServiceOnPostgresOpenRecoversFromAHalfOpenHeal(t *testing.T) {
	t.Parallel()
	const events = 300
	admin := testenv.Postgres(t)
	schema := testenv.Schema(t, admin)
	proxy, dsn := testenv.ProxyPostgresURL(t)
	db, err := postgres.Open(postgres.Config{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(24)
	// A ladder longer than the brake takes to engage: what fails before
	// it holds comes back after the heal (router's black-hole test).
	queue, produced := testenv.Name("svc_heal"), testenv.Name("svc_heal_produced")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology: rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{2 * time.Second, 5 * time.Second}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	testenv.DeleteQueuesAtEnd(t, queue, q.Topology().Config().PoisonQueue, q.Topology().Tiers()[0].Topic, q.Topology().Tiers()[1].Topic, produced)
	conn := testenv.AMQP(t)
	_, err = testenv.Channel(t, conn).QueueDeclare(produced, true, false, false, false, nil)
	require.NoError(t, err)
	r := newRouter(t, watermill.NopLogger{})
	svc := newService(t, service.Config{DB: db, Schema: schema, Router: r, Publisher: q.Publisher(), HealthTimeout: time.Second,
		// The relay's StoreTimeout fits a dial through the proxy and Due's
		// statements on a loaded machine: a call given up loses its
		// connection, and the next one dials again (1 s stalled the
		// outbox's black-hole test's relay in a loaded run).
		Relay: outbox.RelayConfig{Env: sluice.Env{StoreTimeout: 3 * time.Second, PublishTimeout: 5 * time.Second}, PollInterval: 20 * time.Millisecond}})
	require.NoError(t, svc.Add(service.Handler{Broker: q, Name: "heal", PublishTopic: produced, PublishingHandler: produceOne,
		Stages: router.Stages{Brake: &brake.Config{Window: 20, CoolDown: 250 * time.Millisecond, MaxCoolDown: time.Second, Match: brake.MatchUnreachable}}}))
	health := httptest.NewServer(svc.Health())
	t.Cleanup(health.Close)
	status := func(path string) int {
		resp, err := http.Get(health.URL + path)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	done := testenv.RunRouter(context.Background(), r)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = svc.Close()
		}
		require.NoError(t, <-done)
	})
	publish := func(from, n int) {
		for i := from; i < from+n; i++ {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("evt-%05d", i))
			require.NoError(t, q.Publisher().Publish(q.Topology().Config().Queue, m))
		}
	}
	wait := func(cond func() bool, what string) {
		t.Helper()
		require.Eventually(t, cond, 2*time.Minute, 20*time.Millisecond, what)
	}
	publish(0, events/3)
	wait(func() bool { return status("/readyz") == http.StatusOK }, "ready")
	// Batches of effects are awaited by their progress (testenv.AwaitCount).
	require.NoError(t, testenv.AwaitCount(events/3, time.Minute, 10*time.Minute, func() int {
		return min(testenv.QueueDepth(t, conn, produced), events/3)
	}), "consuming and relaying")

	proxy.BlackHole()
	publish(events/3, events/3)
	wait(func() bool { return status("/readyz") == http.StatusServiceUnavailable }, "the hole fails readiness")
	require.Equal(t, http.StatusOK, status("/livez"), "an outage is no reason to restart")
	proxy.HealNewConnections()
	healed := time.Now()
	publish(2*events/3, events-2*events/3)
	wait(func() bool { return status("/readyz") == http.StatusOK }, "ready again after the heal")
	t.Logf("ready again %s after the heal", time.Since(healed).Round(time.Millisecond))
	require.Equal(t, http.StatusOK, status("/livez"))
	ids := map[any]bool{}
	require.NoError(t, testenv.AwaitCount(events, time.Minute, 10*time.Minute, func() int {
		for _, d := range testenv.Drain(t, conn, produced) {
			ids[d.Headers[sluice.EventIDKey]] = true
		}
		return len(ids)
	}), "every event processed, what it produced relayed")
	t.Logf("every event processed and relayed %s after the heal", time.Since(healed).Round(time.Millisecond))

	var closeErr error
	took := testenv.Within(t, 2*time.Minute, "Close", func() { closeErr = svc.Close() })
	require.NoError(t, closeErr)
	closed = true
	t.Logf("Close took %s", took.Round(time.Millisecond))
}
