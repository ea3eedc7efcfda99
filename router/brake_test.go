package router_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the private PostgreSQL's driver
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// newPrivateEffectsDB starts a private PostgreSQL (one the test may stop)
// holding an effects table and an inbox table, and returns it, a pool on it
// closed when t ends, and the inbox store.
func newPrivateEffectsDB(t *testing.T) (*testenv.PrivatePostgres, *sqlx.DB, *sluicesql.Inbox) {
	t.Helper()
	pg := testenv.StartPrivatePostgres(t)
	db, err := sqlx.Open("postgres", pg.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(rabbitmqPrefetch + 4)
	testenv.KeepIdle(db.DB)
	_, err = db.Exec(`CREATE TABLE effects (event_id TEXT PRIMARY KEY)`)
	require.NoError(t, err)
	inbox, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: "inbox"})
	require.NoError(t, err)
	require.NoError(t, inbox.CreateTable(t.Context()))
	return pg, db, inbox
}

// The outage the ladder cannot outlast: 5,000 events; the PostgreSQL the
// handler and the inbox use (a private server) stops for twice the whole
// ladder. The brake engages, the broker sees no consumer, no event spends
// its ladder; after PostgreSQL returns, every event has its row and its
// inbox row, and the poison queue is empty.
func TestBrakeOutageLongerThanTheLadder(t *testing.T) {
	t.Parallel()
	const events, window = 5000, 20
	pg, db, store := newPrivateEffectsDB(t)

	delays := []time.Duration{time.Second, 2 * time.Second}
	queue := testenv.Name("outage")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: queue, TierDelays: delays},
	})
	require.NoError(t, err)
	tiers := q.Topology().Tiers()
	testenv.DeleteQueuesAtEnd(t, queue, q.Topology().Config().PoisonQueue, tiers[0].Topic, tiers[1].Topic)
	t.Cleanup(func() { _ = q.Close() })

	reader := sdkmetric.NewManualReader()
	rows := func() int {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM effects`); err != nil {
			return -1 // down or starting
		}
		return n
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "effects",
		Handler: func(msg *message.Message) error {
			_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
				`INSERT INTO effects (event_id) VALUES ($1)`, msg.Metadata.Get(sluice.EventIDKey))
			return err
		},
		Stages: router.Stages{
			Poison:    &poison.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}},
			Retry:     &retrytiers.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}},
			Brake:     &brake.Config{Window: window, CoolDown: 250 * time.Millisecond, MaxCoolDown: time.Second, Match: brake.MatchUnreachable},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: store, Consumer: "effects"},
			Recoverer: &stage.RecovererConfig{},
			Env:       sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		},
	})
	require.NoError(t, err)

	for i := range events {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("evt-%05d", i))
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })

	require.NoError(t, testenv.AwaitCount(1000, time.Minute, 10*time.Minute, func() int { return min(rows(), 1000) }), "rows before the outage")
	conn := testenv.AMQP(t)
	var mu sync.Mutex
	minConsumers, maxTierDepth := 1<<30, 0
	watch, stopWatch := context.WithCancel(t.Context())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		ch := testenv.Channel(t, conn)
		for watch.Err() == nil {
			info, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			if err != nil {
				return
			}
			depth := 0
			for _, tier := range tiers {
				depth += testenv.QueueDepth(t, conn, tier.Topic)
			}
			mu.Lock()
			minConsumers, maxTierDepth = min(minConsumers, info.Consumers), max(maxTierDepth, depth)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()

	pg.Stop(t)
	// The outage outlasts the ladder, by events, not a sleep a slow machine
	// could cut short: every copy parked before the brake engaged has come
	// back from its tier (the tier queues are empty) to meet the engaged
	// brake.
	stopped := time.Now()
	outlastTheLadder(t, reader, delays[0]+delays[1], func() bool {
		for _, tier := range tiers {
			if testenv.QueueDepth(t, conn, tier.Topic) != 0 {
				return false
			}
		}
		return true
	})
	outage := time.Since(stopped)
	pg.Start(t)
	if err := testenv.AwaitCount(events, time.Minute, 10*time.Minute, rows); err != nil {
		// What stands still: the rows, the queues, the brake.
		depths := map[string]int{queue: testenv.QueueDepth(t, conn, queue), q.Topology().Config().PoisonQueue: testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue)}
		for _, tier := range tiers {
			depths[tier.Topic] = testenv.QueueDepth(t, conn, tier.Topic)
		}
		t.Fatalf("every event processed after the outage: %v (%s); queue depths %v, consumers %d; brake engaged %d, released %d, probes failed %d, held %d; retries %d",
			err, outage.Round(time.Millisecond), depths, testenv.QueueConsumers(t, conn, queue),
			testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "engaged"),
			testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "released"),
			testenv.CounterWhere(t, reader, telemetry.MetricBrakeProbes, string(telemetry.AttrBrakeProbeResult), "failed"),
			testenv.CounterSum(t, reader, telemetry.MetricBrakeHeld), testenv.CounterSum(t, reader, telemetry.MetricRetries))
	}
	stopWatch()
	<-watched

	mu.Lock()
	defer mu.Unlock()
	released := testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "released")
	t.Logf("outage %s: %d copies parked in a tier, %d deliveries held, %d brake engagements, %d releases, tier depth at most %d, consumers at least %d",
		outage.Round(time.Millisecond), testenv.CounterSum(t, reader, telemetry.MetricRetries), testenv.CounterSum(t, reader, telemetry.MetricBrakeHeld),
		testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "engaged"), released, maxTierDepth, minConsumers)
	require.Zero(t, minConsumers, "while braked the broker sees no consumer")
	// From each release (and from the start) at most the failures before the
	// brake engages again reach a tier: window/2 - 1 (the threshold's
	// failure is held). A PostgreSQL that fails again just after the probe
	// that released the brake (still starting, connections reset) starts
	// another such episode. Without the brake every delivery of the outage
	// would reach a tier: thousands.
	bound := int64(window/2-1) * (released + 1)
	require.LessOrEqual(t, int64(maxTierDepth), bound, "at most the failures before the brake engaged reach a tier")
	require.LessOrEqual(t, testenv.CounterSum(t, reader, telemetry.MetricRetries), bound)
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricExhausted))
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricPoisoned))
	require.Zero(t, testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue))
	require.GreaterOrEqual(t, testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "engaged"), int64(1))
	require.Equal(t, testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "released"), int64(1))
	var claims int
	require.NoError(t, db.Get(&claims, `SELECT count(*) FROM inbox`))
	require.Equal(t, events, claims)
}

// outlastTheLadder returns once an outage that began now has outlasted the
// retry ladder, by events rather than a sleep a slow machine could cut
// short: the ladder's whole time has passed, the brake has failed probes
// since it engaged, and more() holds.
func outlastTheLadder(t *testing.T, reader *sdkmetric.ManualReader, ladder time.Duration, more func() bool) {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool {
		return time.Since(start) >= ladder &&
			testenv.CounterWhere(t, reader, telemetry.MetricBrakeProbes, string(telemetry.AttrBrakeProbeResult), "failed") >= 2 && more()
	}, 2*time.Minute, 20*time.Millisecond, "the outage outlasts the ladder")
}

// Control: Poison failures, however many, never engage the brake; every
// message reaches the poison queue.
func TestBrakeIgnoresPoison(t *testing.T) {
	t.Parallel()
	const events = 200
	queue := testenv.Name("allbad")
	q := newRabbitMQ(t, queue, 100*time.Millisecond)
	reader := sdkmetric.NewManualReader()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "allbad",
		Handler: func(*message.Message) error { return sluice.Poison(errors.New("unknown version")) },
		Stages: router.Stages{
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Brake: &brake.Config{Window: 10},
			Env:   sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		},
	})
	require.NoError(t, err)
	for range events {
		require.NoError(t, q.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(`{}`))))
	}
	done := testenv.RunRouter(context.Background(), r)
	conn := testenv.AMQP(t)
	if err := testenv.AwaitCount(events, 2*time.Minute, 10*time.Minute, func() int { return testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue) }); err != nil {
		t.Fatalf("every message in the poison queue: %v; %s", err, testenv.QueueDepths(t, conn, queue, q.Topology().Tiers()[0].Topic))
	}
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricBrakeTransitions))
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricBrakeHeld))
}

// On the embedded default (GoChannel, which cannot stop consuming) held
// deliveries wait in the stage: an outage ten times the ladder spends no
// message's ladder, and the in-process tiers stay nearly empty.
func TestBrakeOnTheEmbeddedDefault(t *testing.T) {
	t.Parallel()
	const events = 300
	var down atomic.Bool
	var handled atomic.Int64
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "inventory", Stages: router.Stages{
		Poison: &poison.Config{}, Retry: &retrytiers.Config{Env: sluice.Env{PublishBackoff: time.Millisecond}}, Classify: &stage.ClassifyConfig{},
		Brake: &brake.Config{Window: 10, CoolDown: 50 * time.Millisecond, MaxCoolDown: 200 * time.Millisecond},
		Env:   sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
	}, Handler: func(*message.Message) error {
		if down.Load() {
			return fmt.Errorf("inventory service: %w", syscall.ECONNREFUSED)
		}
		handled.Add(1)
		return nil
	}})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() { require.NoError(t, e.Close()) })

	down.Store(true)
	testenv.PublishEvents(t, e.PubSub(), "orders", events)
	outlastTheLadder(t, reader, 10*150*time.Millisecond, func() bool { return true }) // ten times the ladder
	require.LessOrEqual(t, e.PendingRetries(), 5, "at most the failures before the brake engaged wait in a tier")
	down.Store(false)
	require.NoError(t, testenv.AwaitCount(events, time.Minute, 10*time.Minute, func() int { return int(handled.Load()) }),
		"every event handled after the outage; %d waiting in a tier, %d poisoned", e.PendingRetries(), len(e.Poisoned()))
	require.Empty(t, e.Poisoned())
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
}

// The brake behind Watermill's own Retry and Timeout, as users stack them on
// the router: held deliveries that Retry tries again are held again, never
// parked or poisoned; once the dependency answers, every event is handled
// once.
func TestBrakeBehindWatermillRetryAndTimeout(t *testing.T) {
	t.Parallel()
	const events = 300
	queue := testenv.Name("composed")
	q := newRabbitMQ(t, queue, 200*time.Millisecond, 400*time.Millisecond)
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	handled := map[string]int{}
	reader := sdkmetric.NewManualReader()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(
		wmiddleware.Retry{MaxRetries: 2, InitialInterval: 10 * time.Millisecond, Logger: watermill.NopLogger{}}.Middleware,
		wmiddleware.Timeout(time.Second),
	)
	_, err = router.Add(r, router.HandlerConfig{Broker: q, Name: "composed", Handler: func(msg *message.Message) error {
		if down.Load() {
			return fmt.Errorf("stock service: %w", syscall.ECONNREFUSED)
		}
		mu.Lock()
		handled[msg.Metadata.Get(sluice.EventIDKey)]++
		mu.Unlock()
		return nil
	}, Stages: router.Stages{
		Poison: &poison.Config{}, Retry: &retrytiers.Config{Env: sluice.Env{PublishBackoff: 10 * time.Millisecond}}, Classify: &stage.ClassifyConfig{},
		Brake: &brake.Config{Window: 10, CoolDown: 100 * time.Millisecond, MaxCoolDown: 400 * time.Millisecond, Match: brake.MatchUnreachable},
		Env:   sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
	}})
	require.NoError(t, err)
	for i := range events {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("evt-%03d", i))
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	runRouter(t, r)
	outlastTheLadder(t, reader, 3*600*time.Millisecond, func() bool { return true }) // three times the ladder
	down.Store(false)
	if err := testenv.AwaitCount(events, 2*time.Minute, 10*time.Minute, func() int { mu.Lock(); defer mu.Unlock(); return len(handled) }); err != nil {
		conn := testenv.AMQP(t)
		t.Fatalf("every event handled after the outage: %v; %s; brake engaged %d, released %d", err,
			testenv.QueueDepths(t, conn, queue, q.Topology().Tiers()[0].Topic, q.Topology().Tiers()[1].Topic, q.Topology().Config().PoisonQueue),
			testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "engaged"),
			testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "released"))
	}
	mu.Lock()
	for id, n := range handled {
		require.Equal(t, 1, n, id)
	}
	mu.Unlock()
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricExhausted))
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricPoisoned))
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), q.Topology().Config().PoisonQueue))
	require.Positive(t, testenv.CounterSum(t, reader, telemetry.MetricBrakeHeld))
}
