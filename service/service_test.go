package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/signing"
)

// rabbit returns a broker on a queue of t's own, with short tiers, and the
// name of a produced queue declared beside it; both deleted at the end.
func rabbit(t *testing.T) (q *rabbitmq.Broker, produced string) {
	t.Helper()
	queue, produced := testenv.Name("svc"), testenv.Name("svc_produced")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{50 * time.Millisecond}},
	})
	require.NoError(t, err)
	names := []string{queue, q.Topology().Config().PoisonQueue, produced}
	for _, tier := range q.Topology().Tiers() {
		names = append(names, tier.Topic)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	t.Cleanup(func() { _ = q.Close() })
	return q, produced
}

// run runs r until the test ends, closing svc (and so r) at the end.
func run(t *testing.T, r *message.Router, svc *service.Service) {
	t.Helper()
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() {
		require.NoError(t, svc.Close())
		require.NoError(t, <-done)
	})
}

func newRouter(t *testing.T, logger watermill.LoggerAdapter) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	return r
}

func newService(t *testing.T, cfg service.Config) *service.Service {
	t.Helper()
	svc, err := service.New(cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Stores().Migrate(t.Context()))
	return svc
}

func produceOne(msg *message.Message) ([]*message.Message, error) {
	evt := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	evt.Metadata.Set(sluice.EventIDKey, "produced:"+msg.Metadata.Get(sluice.EventIDKey))
	return []*message.Message{evt}, nil
}

// The relay is drained with the router: a row a handler commits while the
// router closes is published by the time Close returns, with a relay that
// would otherwise look for it only once an hour — on RabbitMQ and
// PostgreSQL.
func TestARowWrittenJustBeforeCloseIsPublished(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	q, produced := rabbit(t)
	conn := testenv.AMQP(t)
	_, err := testenv.Channel(t, conn).QueueDeclare(produced, true, false, false, false, nil)
	require.NoError(t, err)
	logger := testenv.NewClosingLogger()
	r := newRouter(t, logger)
	svc := newService(t, service.Config{DB: db, Schema: testenv.Schema(t, db), Router: r, Publisher: q.Publisher(),
		Relay: outbox.RelayConfig{PollInterval: time.Hour}})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	require.NoError(t, svc.Add(service.Handler{Broker: q, Name: "held", PublishTopic: produced,
		PublishingHandler: func(msg *message.Message) ([]*message.Message, error) {
			entered <- struct{}{}
			<-release
			return produceOne(msg)
		}}))
	done := testenv.RunRouter(context.Background(), r)
	testenv.PublishEvents(t, q.Publisher(), q.Topology().Config().Queue, 1)
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- svc.Close() }()
	<-logger.Closing // the router is closing, the handler in flight
	close(release)
	require.NoError(t, <-closed)
	require.NoError(t, <-done)
	require.Equal(t, 1, testenv.QueueDepth(t, conn, produced), "published by the time Close returned")
	st, err := svc.Stores().Outbox.Stats(t.Context())
	require.NoError(t, err)
	require.Zero(t, st.Pending)
	require.NoError(t, svc.Close(), "idempotent")
}

// A router closed alone (r.Close, not the service's Close) stops what the
// service started: the relay drains and stops, the pruners stop (TestMain's
// goleak sees no goroutine of theirs left) — on the embedded default and
// SQLite.
func TestRouterCloseAloneStopsWhatTheServiceStarted(t *testing.T) {
	t.Parallel()
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{10 * time.Millisecond}})
	require.NoError(t, err)
	r := newRouter(t, watermill.NopLogger{})
	svc := newService(t, service.Config{DB: testenv.SQLite(t), Router: r, Publisher: e.PubSub().Publisher()})
	require.NoError(t, svc.Add(service.Handler{Broker: e, Name: "orders", PublishTopic: "produced", PublishingHandler: produceOne}))
	out, err := e.PubSub().Subscribe(t.Context(), "produced")
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	require.True(t, *svc.Live(t.Context()).Checks["outbox"].Running)
	testenv.PublishEvents(t, e.PubSub(), "orders", 1)
	m := <-out
	m.Ack()
	require.Equal(t, "produced:evt-0", m.Metadata.Get(sluice.EventIDKey))

	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.Eventually(t, func() bool { return !*svc.Live(t.Context()).Checks["outbox"].Running }, time.Minute, 10*time.Millisecond,
		"the relay stopped with the router")
	require.Equal(t, "pass", svc.Live(t.Context()).Checks["outbox"].Status, "a relay stopped by the router's close is no failure")
	require.NoError(t, e.Close())
}

// The pruners run with the router: inbox records and replay outcomes older
// than their retention are deleted, the others kept — on PostgreSQL and
// SQLite.
func TestPrunersRun(t *testing.T) {
	t.Parallel()
	for name, db := range map[string]func(t *testing.T) (*sqlx.DB, string){
		"postgres": func(t *testing.T) (*sqlx.DB, string) { db := testenv.Postgres(t); return db, testenv.Schema(t, db) },
		"sqlite":   func(t *testing.T) (*sqlx.DB, string) { return testenv.SQLite(t), "" },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db, schema := db(t)
			e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Millisecond}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.Close() })
			r := newRouter(t, watermill.NopLogger{})
			svc := newService(t, service.Config{DB: db, Schema: schema, Router: r,
				InboxRetention: time.Hour, ReplayWindow: time.Minute, OutcomeRetention: time.Hour, PruneInterval: 20 * time.Millisecond})
			require.NoError(t, svc.Add(service.Handler{Broker: e, Name: "orders", Handler: func(*message.Message) error { return nil }}))
			stores := svc.Stores()
			inbox := "sluice_inbox"
			if schema != "" {
				inbox = schema + "." + inbox
			}
			for _, key := range []string{"old-1", "old-2"} { // claims two hours old
				claimAt(t, db, inbox, key, time.Now().Add(-2*time.Hour))
			}
			claimAt(t, db, inbox, "recent", time.Now())
			require.NoError(t, stores.Outcomes.Records(t.Context(), []replay.Record{
				{Run: "old", Item: "a", Outcome: "processed", At: time.Now().Add(-2 * time.Hour)},
				{Run: "new", Item: "a", Outcome: "processed", At: time.Now()},
			}))
			run(t, r, svc)
			var keys []string
			var outcomes []replay.Record
			require.Eventually(t, func() bool {
				keys = nil
				require.NoError(t, db.Select(&keys, `SELECT event_key FROM `+inbox))
				outcomes, err = stores.Outcomes.Outcomes(t.Context(), "")
				require.NoError(t, err)
				return len(keys) == 1 && len(outcomes) == 1
			}, time.Minute, 10*time.Millisecond, "the old claims and outcomes pruned")
			require.Equal(t, []string{"recent"}, keys)
			require.Equal(t, "new", outcomes[0].Run)
		})
	}
}

// The health report says the brake is engaged (503 on /readyz, not on
// /livez: an outage is no reason to restart) and how far behind the relay
// is — a produced row the broker cannot route stays, counted, its age
// growing — on RabbitMQ and PostgreSQL.
func TestHealthReportsTheBrakeAndTheRelaysLag(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	q, produced := rabbit(t) // produced is not declared: NO_ROUTE
	r := newRouter(t, watermill.NopLogger{})
	svc := newService(t, service.Config{DB: db, Schema: testenv.Schema(t, db), Router: r, Publisher: q.Publisher(),
		Relay: outbox.RelayConfig{RetryMin: time.Hour, RetryMax: time.Hour}})
	require.NoError(t, svc.Add(service.Handler{Broker: q, Name: "stock", PublishTopic: produced,
		PublishingHandler: func(msg *message.Message) ([]*message.Message, error) {
			if string(msg.Payload) == "down" {
				return nil, fmt.Errorf("stock service: %w", syscall.ECONNREFUSED)
			}
			return produceOne(msg)
		},
		Stages: router.Stages{Brake: &brake.Config{Match: brake.MatchUnreachable, Window: 4, FailureRatio: 0.5, CoolDown: time.Hour}},
	}))
	h := svc.Health()
	code, body := get(t, h, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "the router does not run the handler yet")
	run(t, r, svc)

	testenv.PublishEvents(t, q.Publisher(), q.Topology().Config().Queue, 1) // produces a row the broker cannot route
	var ready service.Report
	require.Eventually(t, func() bool {
		ready = svc.Ready(t.Context())
		o := ready.Checks["outbox"]
		return o.Failing != nil && *o.Failing == 1 && *o.OldestAgeSeconds > 0
	}, time.Minute, 10*time.Millisecond, "the unroutable row counted, its age growing: %+v", ready)
	require.Equal(t, "pass", ready.Status, "a destination that refuses is the alert's, not the readiness's: %+v", ready)
	require.Equal(t, int64(1), *ready.Checks["outbox"].Pending)
	require.True(t, *ready.Checks["outbox"].Running)
	require.NotNil(t, ready.Checks["handler:stock"].Connected, "the RabbitMQ consumer says whether it is connected: %+v", ready)
	require.True(t, *ready.Checks["handler:stock"].Connected)

	for i := range 4 {
		m := message.NewMessage(watermill.NewUUID(), []byte("down"))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("down-", i))
		require.NoError(t, q.Publisher().Publish(q.Topology().Config().Queue, m))
	}
	require.Eventually(t, func() bool { return svc.Ready(t.Context()).Checks["handler:stock"].Brake == "engaged" }, time.Minute, 10*time.Millisecond)
	code, body = get(t, h, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.NoError(t, json.Unmarshal([]byte(body), &ready))
	require.Equal(t, "fail", ready.Checks["handler:stock"].Status)
	require.Contains(t, ready.Checks["handler:stock"].Error, "the brake is engaged")
	require.Equal(t, "pass", ready.Checks["database"].Status)
	code, body = get(t, h, "/livez")
	require.Equal(t, http.StatusOK, code, body)
	code, _ = get(t, h, "/other/livez")
	require.Equal(t, http.StatusOK, code, "any path ending in /livez")
	code, body = get(t, h, "/healthz") // a liveness probe at the wrong path: not the readiness report
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, "/livez")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/readyz", nil))
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}

// claimAt writes a claim of key processed at at into the inbox table.
func claimAt(t *testing.T, db *sqlx.DB, table, key string, at time.Time) {
	t.Helper()
	var processed any = at
	if db.DriverName() == "sqlite" {
		processed = at.UnixMicro() // the SQLite store's processed_at
	}
	_, err := db.Exec(db.Rebind(`INSERT INTO `+table+` (consumer, event_key, processed_at) VALUES ('orders', ?, ?)`), key, processed)
	require.NoError(t, err)
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// Overrides that cannot keep the promise are refused as router.Add refuses
// them, and so are settings the service cannot honour.
func TestUnsafeOverridesAreRefused(t *testing.T) {
	t.Parallel()
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Hour}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	db := testenv.SQLite(t)
	r := newRouter(t, watermill.NopLogger{})
	svc := newService(t, service.Config{DB: db, Router: r, Publisher: e.PubSub().Publisher()})
	noPublisher := newService(t, service.Config{DB: db, Router: newRouter(t, watermill.NopLogger{})})
	short := newService(t, service.Config{DB: db, Router: newRouter(t, watermill.NopLogger{}), InboxRetention: 30 * time.Minute, ReplayWindow: time.Minute})
	h := func(*message.Message) error { return nil }
	for _, tt := range []struct {
		svc  *service.Service
		h    service.Handler
		want string
	}{
		{svc, service.Handler{Broker: e, Handler: h}, "Handler.Name is required"},
		{svc, service.Handler{Name: "orders", Handler: h}, "Handler.Broker is required"},
		{svc, service.Handler{Name: "orders", Broker: e, Handler: h, Without: []string{"Poison"}}, "Stages.Retry needs Stages.Poison"},
		{svc, service.Handler{Name: "orders", Broker: e, PublishingHandler: produceOne, PublishTopic: "p", Without: []string{"Inbox"}}, "HandlerConfig.Outbox needs Stages.Inbox"},
		{svc, service.Handler{Name: "orders", Broker: e, PublishingHandler: produceOne, PublishTopic: "p",
			Stages: router.Stages{Inbox: &deduplication.Config{Store: deduplication.NewMemoryStore()}}}, "no SQL transactions"},
		{svc, service.Handler{Name: "orders", Broker: e, Handler: h, Without: []string{"Nope"}}, `no stage "Nope"`},
		{short, service.Handler{Name: "orders", Broker: e, Handler: h}, "Config.InboxRetention is too short for handler \"orders\""},
		{noPublisher, service.Handler{Name: "orders", Broker: e, PublishingHandler: produceOne, PublishTopic: "p"}, "Config.Publisher is required"},
	} {
		err := tt.svc.Add(tt.h)
		require.ErrorContains(t, err, tt.want)
		if tt.h.Without != nil && tt.h.Without[0] == "Poison" {
			require.ErrorIs(t, err, router.ErrUnsafeStages)
		}
	}
	// Without the inbox the retention is no concern.
	require.NoError(t, short.Add(service.Handler{Name: "orders", Broker: e, Handler: h, Without: []string{"Inbox"}}))
	require.NoError(t, svc.Add(service.Handler{Name: "orders", Broker: e, Handler: h}))
	require.NoError(t, noPublisher.Close())
	require.NoError(t, short.Close())
	require.NoError(t, svc.Close())
	require.ErrorIs(t, svc.Add(service.Handler{Name: "more", Broker: e, Handler: h}), service.ErrClosed)
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	r := newRouter(t, watermill.NopLogger{})
	running := newRouter(t, watermill.NopLogger{})
	done := testenv.RunRouter(context.Background(), running)
	t.Cleanup(func() {
		require.NoError(t, running.Close())
		require.NoError(t, <-done)
	})
	for _, tt := range []struct {
		cfg  service.Config
		want string
	}{
		{service.Config{DB: db}, "Config.Router is required"},
		{service.Config{DB: db, Router: running}, "Config.Router is running"},
		{service.Config{Router: r}, "Config.DB is required"},
		{service.Config{DB: db, Router: r, Schema: "s"}, "Config.Schema is PostgreSQL's"},
		{service.Config{DB: db, Router: r, DrainTimeout: -1}, "Config.DrainTimeout must not be negative"},
		{service.Config{DB: db, Router: r, Relay: outbox.RelayConfig{BatchSize: -1}, Publisher: nopPublisher{}}, "Config.Relay: outbox: RelayConfig.BatchSize"},
		{service.Config{DB: db, Router: r, InboxRetention: time.Hour, ReplayWindow: 2 * time.Hour}, "Config.InboxRetention"},
	} {
		_, err := service.New(tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
}

// Config.Env.Signer reaches every stage that publishes a copy: the poison
// queue's copy of a malformed message carries the signature
// (docs/production.md, "The signing key"), on RabbitMQ.
func TestTheSignerSignsTheCopies(t *testing.T) {
	t.Parallel()
	q, _ := rabbit(t)
	signer, err := signing.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	r := newRouter(t, watermill.NopLogger{})
	svc := newService(t, service.Config{DB: testenv.SQLite(t), Router: r, Env: sluice.Env{Signer: signer}})
	require.NoError(t, svc.Add(service.Handler{Broker: q, Name: "signed", Key: sluice.KeyFromJSON("eventId"),
		Handler: func(*message.Message) error { return nil }}))
	run(t, r, svc)
	require.NoError(t, q.Publisher().Publish(q.Topology().Config().Queue, message.NewMessage(watermill.NewUUID(), []byte(`{"eventId":`))))
	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue) == 1 }, time.Minute, 10*time.Millisecond)
	got := testenv.Drain(t, conn, q.Topology().Config().PoisonQueue)
	require.Len(t, got, 1)
	require.NotEmpty(t, got[0].Headers[sluice.SignatureKey])
}
