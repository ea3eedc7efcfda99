package router_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// quorumLimit is the x-delivery-limit of the quorum queues below: a
// message returned more often is dead-lettered by the broker itself.
const quorumLimit = 5

// newQuorumRabbitMQ declares queue (and its tiers) as quorum queues with
// x-delivery-limit quorumLimit, all deleted when t ends.
func newQuorumRabbitMQ(t *testing.T, queue string, delays ...time.Duration) *rabbitmq.Broker {
	t.Helper()
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: delays, Quorum: true, DeliveryLimit: quorumLimit},
	})
	require.NoError(t, err)
	names := []string{queue, q.Topology().Config().PoisonQueue}
	for _, tier := range q.Topology().Tiers() {
		names = append(names, tier.Topic)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// deliveries observes every delivery the handler's stages see: the most
// returns one had (x-delivery-count), and each event's successful runs.
type deliveries struct {
	mu         sync.Mutex
	maxReturns int
	handled    map[string]int
}

func (d *deliveries) observe(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		n, _ := strconv.Atoi(msg.Metadata.Get(metakeys.DeliveryCount))
		d.mu.Lock()
		d.maxReturns = max(d.maxReturns, n)
		d.mu.Unlock()
		return h(msg)
	}
}

func (d *deliveries) processed(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.handled[id]++
}

func (d *deliveries) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.handled)
}

// pingingStore is an inbox store that can ping its database: router.Add
// gives its Ping to the brake as the Probe.
type pingingStore struct {
	*sluicesql.Inbox
	db    *sqlx.DB
	pings atomic.Int64 // failed pings
}

func (s *pingingStore) Ping(ctx context.Context) error {
	err := s.db.PingContext(ctx)
	if err != nil {
		s.pings.Add(1)
	}
	return err
}

// runBraked runs a router with handler on q behind the whole stack (inbox
// when given) and a brake of short cool-downs that watches unreachable
// dependencies; seen observes every delivery. It returns the stages' metrics.
func runBraked(t *testing.T, q *rabbitmq.Broker, seen *deliveries, handler message.NoPublishHandlerFunc, inbox *deduplication.Config) *sdkmetric.ManualReader {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(seen.observe)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "braked", Handler: handler,
		Stages: router.Stages{
			Poison:    &poison.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}},
			Retry:     &retrytiers.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}},
			Brake:     &brake.Config{Window: 20, CoolDown: 10 * time.Millisecond, MaxCoolDown: 20 * time.Millisecond, Match: brake.MatchUnreachable},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     inbox,
			Recoverer: &stage.RecovererConfig{},
			Env:       sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		},
	})
	require.NoError(t, err)
	runRouter(t, r)
	return reader
}

func publishEvents(t *testing.T, q *rabbitmq.Broker, queue string, n int) {
	t.Helper()
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprintf("evt-%03d", i))
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
}

// A long outage on a quorum queue spends no delivery limit: 100 events on a
// quorum queue with x-delivery-limit 5, the PostgreSQL of the inbox and the
// handler (a private server) refusing connections for 100 failed probes.
// The brake probes the database (the inbox store's Ping), not a delivery,
// so no probe returns a message; the deliveries in flight when it engaged
// go back once. Then PostgreSQL returns: none was dead-lettered by the
// broker, each is processed once.
//
// Before the dependency probe, every failed probe returned the probe and
// the 15 deliveries prefetched beside it, the same head messages on every
// cycle: all 100 ended in the poison queue (x-delivery-limit), none
// processed.
func TestBrakeLongOutageOnAQuorumQueueSpendsNoDeliveryLimit(t *testing.T) {
	t.Parallel()
	const events, probes = 100, 100
	pg, db, inbox := newPrivateEffectsDB(t)
	store := &pingingStore{Inbox: inbox, db: db}

	queue := testenv.Name("quorum_outage")
	q := newQuorumRabbitMQ(t, queue, 500*time.Millisecond, time.Second)
	publishEvents(t, q, queue, events)
	pg.Stop(t) // down before the first delivery

	seen := &deliveries{handled: map[string]int{}}
	reader := runBraked(t, q, seen, func(msg *message.Message) error {
		id := msg.Metadata.Get(sluice.EventIDKey)
		if _, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(),
			`INSERT INTO effects (event_id) VALUES ($1)`, id); err != nil {
			return err
		}
		seen.processed(id)
		return nil
	}, &deduplication.Config{Store: store, Consumer: "effects"})

	conn := testenv.AMQP(t)
	deadLettered := func() int { return testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue) }
	// A failed probe is a failed ping, or a probe delivery that failed (the
	// brake engaged again after its first engagement). Without the ping,
	// the broker dead-letters every message before the 100th probe, and
	// nothing is left to probe with: the wait ends there too.
	failedProbes := func() int64 {
		return store.pings.Load() + max(0, testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "engaged")-1)
	}
	require.Eventually(t, func() bool { return failedProbes() >= probes || deadLettered() == events },
		3*time.Minute, 5*time.Millisecond, "the outage lasts %d failed probes", probes) // a liveness bound: each probe is AMQP round trips, slow on a loaded machine
	poisonedDuringOutage := deadLettered()
	pg.Start(t)

	// Wait on the committed effects, not on the handler's own record: the
	// handler notes an event before its inbox transaction commits, and
	// counting the table at that moment saw 99 of 100 once.
	committed := func() int {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM effects`); err != nil {
			return -1 // still starting
		}
		return n
	}
	if err := testenv.AwaitCount(events, 2*time.Minute, 10*time.Minute, func() int { return committed() + deadLettered() }); err != nil {
		t.Fatalf("every event committed or dead-lettered after the outage: %v; %s", err, testenv.QueueDepths(t, conn, queue, q.Topology().Tiers()[0].Topic, q.Topology().Tiers()[1].Topic))
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	t.Logf("%d failed probes (%d pings); %d of %d dead-lettered by the broker (%d during the outage); %d processed; the most returns of a delivery %d (x-delivery-limit %d); %d copies in a tier, %d engagements",
		failedProbes(), store.pings.Load(), deadLettered(), events, poisonedDuringOutage, len(seen.handled), seen.maxReturns, quorumLimit,
		testenv.CounterSum(t, reader, telemetry.MetricRetries), testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "engaged"))
	require.GreaterOrEqual(t, failedProbes(), int64(probes))
	require.Zero(t, deadLettered(), "no message dead-lettered by the broker")
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricPoisoned))
	require.Len(t, seen.handled, events)
	for id, n := range seen.handled {
		require.Equal(t, 1, n, "%s processed once", id)
	}
	engagements := testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "engaged")
	require.LessOrEqual(t, int64(seen.maxReturns), engagements, "a delivery goes back at most once per engagement, never per probe")
	var effects, claims int
	require.NoError(t, db.Get(&effects, `SELECT count(*) FROM effects`))
	require.NoError(t, db.Get(&claims, `SELECT count(*) FROM inbox`))
	require.Equal(t, events, effects)
	require.Equal(t, events, claims)
}

// Without a Probe every probe is a delivery, and a failed one costs
// nothing: the retry stage sets it aside — a confirmed copy in the first
// tier, its attempt unchanged — instead of returning it to the queue. On a
// quorum queue with x-delivery-limit 5 and a dependency refusing
// connections for 5 s (at least 30 failed probes), none of 100 messages is
// dead-lettered by the broker, and each is processed once afterwards.
// (Before, each failed probe delivery was returned: the returns grew with
// the outage, about one message dead-lettered per 6 failed probes.)
func TestBrakeWithoutAProbeAnOutageDeadLettersNothing(t *testing.T) {
	t.Parallel()
	const events, probes = 100, 30
	dependency := freeAddr(t) // nothing listens: a real ECONNREFUSED
	queue := testenv.Name("quorum_probes")
	q := newQuorumRabbitMQ(t, queue, 500*time.Millisecond, time.Second)
	publishEvents(t, q, queue, events)

	seen := &deliveries{handled: map[string]int{}}
	reader := runBraked(t, q, seen, func(msg *message.Message) error {
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(msg.Context(), "tcp", dependency)
		if err != nil {
			return fmt.Errorf("stock service: %w", err)
		}
		_ = c.Close()
		seen.processed(msg.Metadata.Get(sluice.EventIDKey))
		return nil
	}, nil)

	conn := testenv.AMQP(t)
	deadLettered := func() int { return testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue) }
	engaged := func() int64 {
		return testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), "engaged")
	}
	outage := time.Now()
	require.Eventually(t, func() bool { return engaged()-1 >= probes || deadLettered() == events },
		3*time.Minute, 5*time.Millisecond, "the outage lasts %d failed probes", probes) // a liveness bound: each probe is AMQP round trips, slow on a loaded machine
	if rest := 5*time.Second - time.Since(outage); rest > 0 {
		time.Sleep(rest) // the outage lasts at least 5 s: a length, not a wait for an event
	}
	l, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", dependency) // the dependency answers again
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()

	if err := testenv.AwaitCount(events, 2*time.Minute, 10*time.Minute, func() int { return seen.count() + deadLettered() }); err != nil {
		t.Fatalf("every event processed or dead-lettered after the outage: %v; %s", err, testenv.QueueDepths(t, conn, queue, q.Topology().Tiers()[0].Topic, q.Topology().Tiers()[1].Topic))
	}
	failed := engaged() - 1
	seen.mu.Lock()
	defer seen.mu.Unlock()
	t.Logf("%d failed probe deliveries in %s; %d of %d dead-lettered by the broker; %d processed; the most returns of a delivery %d",
		failed, time.Since(outage).Round(time.Millisecond), deadLettered(), events, len(seen.handled), seen.maxReturns)
	require.GreaterOrEqual(t, failed, int64(probes))
	require.Zero(t, deadLettered(), "no message dead-lettered by the broker")
	require.Len(t, seen.handled, events)
	for id, n := range seen.handled {
		require.Equal(t, 1, n, "%s processed once", id)
	}
}

// freeAddr returns an address of 127.0.0.1 nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
