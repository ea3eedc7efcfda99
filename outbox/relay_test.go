package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/signing"
	"github.com/sluicemq/sluice/sluicesql"
)

// service is a consumer on RabbitMQ and PostgreSQL whose handler produces
// messages: its queue, the queue of what it produces, its inbox and its
// outbox in a schema of the test's own.
type service struct {
	t        *testing.T
	db       *sqlx.DB
	schema   string
	rabbit   *rabbitmq.Broker
	produced string // the queue the handler's messages go to
	inbox    *sluicesql.Inbox
	outbox   *sluicesql.Outbox
	meter    *sdkmetric.ManualReader
	mp       *sdkmetric.MeterProvider
	conn     *amqp.Connection
	signer   *signing.Signer // the stages', when set
}

func newService(t *testing.T, amqpURL string) *service {
	t.Helper()
	return newServiceWithTiers(t, amqpURL, 50*time.Millisecond)
}

// newServiceWithTiers is newService with a retry tier of each delay.
func newServiceWithTiers(t *testing.T, amqpURL string, tiers ...time.Duration) *service {
	t.Helper()
	db := testenv.Postgres(t)
	s := &service{t: t, db: db, schema: testenv.Schema(t, db), produced: testenv.Name("produced"), meter: sdkmetric.NewManualReader()}
	s.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.meter))
	s.inbox = testenv.SQLStore(t, db, s.schema+".inbox")
	var err error
	s.outbox = testenv.Migrate(t, db, sluicesql.Config{Schema: s.schema, Outbox: sluicesql.OutboxConfig{Table: "outbox"}}).Outbox
	queue := testenv.Name("consumer")
	s.rabbit, err = rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: amqpURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: tiers},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.rabbit.Close() })
	s.conn, err = amqp.Dial(amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.conn.Close() })
	ch, err := s.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(s.produced, true, false, false, false, nil)
	require.NoError(t, err)
	_ = ch.Close()
	if amqpURL == testenv.AMQPURL {
		testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", s.produced)
		for _, tier := range s.rabbit.Topology().Tiers() {
			testenv.DeleteQueuesAtEnd(t, tier.Topic)
		}
	}
	return s
}

// run adds h as a reliable publishing handler (the whole stack, its
// messages through the outbox when withOutbox) and runs the router until
// the test ends.
func (s *service) run(h message.HandlerFunc, pub message.Publisher, withOutbox bool) {
	s.runWith(h, pub, withOutbox, nil, nil)
}

// runWith is run with Watermill middlewares added to the router before the
// stages (Watermill runs them outside) and after them (inside).
func (s *service) runWith(h message.HandlerFunc, pub message.Publisher, withOutbox bool, outer, inner []message.HandlerMiddleware) {
	t := s.t
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(outer...)
	cfg := router.HandlerConfig{
		Name:              "svc",
		Broker:            s.rabbit,
		PublishingHandler: h,
		PublishTopic:      s.produced,
		Stages: router.Stages{
			Env:       sluice.Env{MeterProvider: s.mp, Signer: s.signer},
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: s.inbox},
			Recoverer: &stage.RecovererConfig{},
		},
	}
	if withOutbox {
		cfg.Outbox = s.outbox
	} else {
		// Publishing after the inbox's commit, the loss accepted: the path
		// the outbox replaces (router.Add refuses it without the opt-in).
		cfg.Publisher, cfg.PublishAtMostOnce = pub, true
	}
	_, err = router.Add(r, cfg)
	require.NoError(t, err)
	r.AddMiddleware(inner...)
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
}

// relay runs a relay of the service's outbox on pub until the test ends.
func (s *service) relay(pub message.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t := s.t
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = s.mp
	}
	r, err := outbox.NewRelay(s.outbox, pub, cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	return r
}

func (s *service) send(eventID, payload string) {
	s.t.Helper()
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	m.Metadata.Set(sluice.EventIDKey, eventID)
	require.NoError(s.t, s.rabbit.Publisher().Publish(s.rabbit.Topology().Config().Queue, m))
}

// producedMessages waits until the produced queue holds n messages — by
// their progress (testenv.AwaitCount): 2,000 rows on a loaded machine are
// slow, not stuck — and returns them (taken off the queue).
func (s *service) producedMessages(n int) []amqp.Delivery {
	s.t.Helper()
	require.NoError(s.t, testenv.AwaitCount(n, time.Minute, 10*time.Minute, func() int { return min(testenv.QueueDepth(s.t, s.conn, s.produced), n) }),
		"%d produced messages reach their queue", n)
	return testenv.Drain(s.t, s.conn, s.produced)
}

func (s *service) count(table string) int {
	s.t.Helper()
	var n int
	require.NoError(s.t, s.db.Get(&n, `SELECT count(*) FROM `+s.schema+`.`+table))
	return n
}

func (s *service) settled(duplicates int64) {
	s.t.Helper()
	require.Eventually(s.t, func() bool { return testenv.CounterSum(s.t, s.meter, telemetry.MetricInboxDuplicates) >= duplicates },
		2*time.Minute, 10*time.Millisecond)
}

// failFirst fails the first n publishes, then publishes on pub.
type failFirst struct {
	pub   message.Publisher
	n     atomic.Int64
	calls atomic.Int64
}

func (f *failFirst) Publish(topic string, msgs ...*message.Message) error {
	f.calls.Add(1)
	if f.n.Add(-1) >= 0 {
		return fmt.Errorf("%w: injected: the confirm did not come", sluice.ErrPublishUncertain)
	}
	return f.pub.Publish(topic, msgs...)
}
func (f *failFirst) Close() error { return nil }

func produceOne(ran *atomic.Int64) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ran.Add(1)
		evt := message.NewMessage(watermill.NewUUID(), []byte(`{"reserved":true}`))
		evt.Metadata.Set(sluice.EventIDKey, "reserved:"+msg.Metadata.Get(sluice.EventIDKey))
		return []*message.Message{evt}, nil
	}
}

// Issue 21, the defect: without an outbox, the router publishes a
// PublishingHandler's messages after the inbox committed; when that publish
// fails, the redelivery is a duplicate, skipped — the produced event is
// never published. This is the path the router takes without
// HandlerConfig.Outbox, measured: handler ran 1×, inbox row 1, produced 0.
func TestWithoutAnOutboxAPublishFailingAfterTheCommitLosesTheEvent(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	var ran atomic.Int64
	pub := &failFirst{pub: s.rabbit.Publisher()}
	pub.n.Store(1)
	s.run(produceOne(&ran), pub, false)
	s.send("evt-1", `{}`)
	s.settled(1) // the redelivery was skipped as a duplicate
	require.Equal(t, int64(1), ran.Load())
	require.Equal(t, 1, s.count("inbox"))
	require.Equal(t, int64(1), pub.calls.Load(), "the duplicate produced nothing to publish")
	require.Zero(t, testenv.QueueDepth(t, s.conn, s.produced), "the produced event is lost")
}

// Issue 21: with HandlerConfig.Outbox the produced event is a row of the
// inbox's commit, and the relay publishes it although its first publish
// fails: delivered once, the outbox empty, the handler run once. The relay
// polls once an hour: the commit wakes it, and the failed row's retry is
// scheduled, not left to the poll.
func TestAnOutboxDeliversWhatAFailedPublishWouldLose(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	var ran atomic.Int64
	pub := &failFirst{pub: s.rabbit.Publisher()}
	pub.n.Store(1)
	s.run(produceOne(&ran), nil, true)
	s.relay(pub, outbox.RelayConfig{PollInterval: time.Hour, RetryMin: 50 * time.Millisecond})
	s.send("evt-1", `{}`)
	got := s.producedMessages(1)
	require.Len(t, got, 1)
	require.Equal(t, "reserved:evt-1", got[0].Headers[sluice.EventIDKey])
	require.NotEmpty(t, got[0].Headers["_watermill_message_uuid"], "the message id given at write time")
	require.Equal(t, int64(2), pub.calls.Load(), "published on the second attempt")
	require.Equal(t, int64(1), ran.Load())
	require.Eventually(t, func() bool { return s.count("outbox") == 0 }, time.Minute, 10*time.Millisecond)
	require.Equal(t, 1, s.count("inbox"))
	// Counted once the batch's Finish returned, after the delete committed.
	require.Eventually(t, func() bool { return testenv.CounterSum(t, s.meter, telemetry.MetricOutboxRelayed) == 1 }, time.Minute, 10*time.Millisecond)
	require.Equal(t, int64(1), testenv.CounterWhere(t, s.meter, telemetry.MetricOutboxFailures, "error.type", "uncertain"))
}

// A delivery that fails produces nothing (its rows roll back with it); its
// retry, which succeeds, produces once. A rejection after a statement that
// aborted the PostgreSQL transaction produces what it wrote — before the
// abort through Publish, after it as the returned messages — with its claim.
func TestWhatIsProducedCommitsWithTheDelivery(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	_, err := s.db.Exec(`CREATE TABLE ` + s.schema + `.orders (id TEXT PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = s.db.Exec(`INSERT INTO ` + s.schema + `.orders (id) VALUES ('taken')`)
	require.NoError(t, err)
	var ran atomic.Int64
	h := func(msg *message.Message) ([]*message.Message, error) {
		ran.Add(1)
		ctx := msg.Context()
		attempt, _ := sluice.Attempt(msg)
		evt := func(name string) *message.Message {
			m := message.NewMessage(watermill.NewUUID(), []byte(name))
			m.Metadata.Set(sluice.EventIDKey, name)
			return m
		}
		switch string(msg.Payload) {
		case "fails-once":
			if err := s.outbox.Publish(ctx, s.produced, evt(fmt.Sprintf("fails-once-attempt-%d", attempt))); err != nil {
				return nil, err
			}
			if attempt == 1 {
				return nil, sluice.Transient(errors.New("the stock service timed out"))
			}
			return nil, nil
		case "rejected":
			if err := s.outbox.Publish(ctx, s.produced, evt("before-the-abort")); err != nil {
				return nil, err
			}
			_, err := sluicesql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO `+s.schema+`.orders (id) VALUES ('taken')`)
			require.Error(t, err, "a unique violation aborts the transaction")
			return []*message.Message{evt("rejection-event")}, sluice.Reject(fmt.Errorf("order taken: %w", err))
		}
		return nil, fmt.Errorf("unexpected payload %q", msg.Payload)
	}
	s.run(h, nil, true)
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{})
	s.send("evt-fails", "fails-once")
	s.send("evt-rejected", "rejected")
	got := s.producedMessages(3)
	var names []string
	for _, d := range got {
		names = append(names, string(d.Body))
	}
	require.ElementsMatch(t, []string{"fails-once-attempt-2", "before-the-abort", "rejection-event"}, names,
		"the failed attempt's message rolled back; the rejection's committed with its claim")
	require.Equal(t, 2, s.count("inbox"))
	require.Equal(t, 1, s.count("orders"))
	require.Equal(t, int64(3), ran.Load())
	require.Eventually(t, func() bool { return s.count("outbox") == 0 }, time.Minute, 10*time.Millisecond)
}

// A destination the broker cannot route to keeps its rows, with their
// error, counted; the other destination keeps flowing. Once the queue is
// declared, RetryNow sends them.
func TestAnUnroutableDestinationKeepsItsRowsAndBlocksNothing(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	missing := testenv.Name("missing")
	testenv.DeleteQueuesAtEnd(t, missing)
	var ran atomic.Int64
	h := func(msg *message.Message) ([]*message.Message, error) {
		ran.Add(1)
		ctx := msg.Context()
		if err := s.outbox.Publish(ctx, missing, message.NewMessage(watermill.NewUUID(), msg.Payload)); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	}
	s.run(h, nil, true)
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{RetryMin: time.Hour, RetryMax: time.Hour, BatchSize: 7})
	const n = 40
	for i := range n {
		s.send(fmt.Sprint("evt-", i), fmt.Sprint(i))
	}
	require.Len(t, s.producedMessages(n), n, "the routable destination gets every message")
	require.Eventually(t, func() bool {
		return testenv.CounterWhere(t, s.meter, telemetry.MetricOutboxFailures, "error.type", "refused") == n
	}, 2*time.Minute, 10*time.Millisecond, "each unroutable row failed once, and waits (RetryMin is an hour)")
	// The failures are counted before their batch's Finish, which deletes
	// the routable rows and records the failed ones in one transaction.
	require.Eventually(t, func() bool { return s.count("outbox") == n }, time.Minute, 10*time.Millisecond, "only the unroutable rows stay")
	failing, err := s.outbox.List(t.Context(), sluicesql.OutboxFailing, 100)
	require.NoError(t, err)
	require.Len(t, failing, n)
	for _, e := range failing {
		require.Equal(t, missing, e.Topic)
		require.Contains(t, e.LastError, "unroutable")
		require.Equal(t, 1, e.Attempts)
	}

	ch, err := s.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(missing, true, false, false, false, nil)
	require.NoError(t, err)
	_ = ch.Close()
	retried, err := s.outbox.RetryNow(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(n), retried)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, s.conn, missing) == n }, 2*time.Minute, 10*time.Millisecond)
	require.Eventually(t, func() bool { return s.count("outbox") == 0 }, time.Minute, 10*time.Millisecond)
}

// A producer that is not a consumer (an HTTP handler) writes in its own
// transaction; two relays at once publish each of 2,000 rows exactly once
// (no fault: at least once would allow more, SKIP LOCKED gives once).
func TestTwoRelaysPublishEveryRowOnce(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	const n = 2000
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{BatchSize: 50})
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{BatchSize: 50})
	for i := range n / 100 {
		tx, err := s.db.BeginTxx(t.Context(), nil)
		require.NoError(t, err)
		msgs := make([]*message.Message, 100)
		for j := range msgs {
			msgs[j] = message.NewMessage(fmt.Sprint("m-", i*100+j), nil)
		}
		require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, msgs...))
		require.NoError(t, tx.Commit())
		s.outbox.Wake() // one relay; the other finds the rows within its PollInterval
	}
	got := s.producedMessages(n)
	seen := map[string]bool{}
	for _, d := range got {
		id, _ := d.Headers["_watermill_message_uuid"].(string)
		require.False(t, seen[id], "%s published twice", id)
		seen[id] = true
	}
	require.Len(t, seen, n)
	require.Eventually(t, func() bool { return s.count("outbox") == 0 }, time.Minute, 10*time.Millisecond)
}

// holding publishes nothing until released — or, with held, nothing of
// the messages in held; started closes at the first call it holds.
type holding struct {
	pub     message.Publisher
	held    map[string]bool // nil: every message
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *holding) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if h.held == nil || h.held[m.UUID] {
			h.once.Do(func() { close(h.started) })
			<-h.release
			break
		}
	}
	return h.pub.Publish(topic, msgs...)
}
func (h *holding) Close() error { return nil }

// Close in the middle of a batch finishes it: its rows are published and
// deleted, then Run returns.
func TestCloseFinishesTheBatchInFlight(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	pub := &holding{pub: s.rabbit.Publisher(), started: make(chan struct{}), release: make(chan struct{})}
	r, err := outbox.NewRelay(s.outbox, pub, outbox.RelayConfig{BatchSize: 10})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	msgs := make([]*message.Message, 5)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
	}
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, msgs...))
	require.NoError(t, tx.Commit())
	s.outbox.Wake()
	<-pub.started
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	close(pub.release)
	require.NoError(t, <-closed)
	require.NoError(t, <-done)
	require.Equal(t, 5, testenv.QueueDepth(t, s.conn, s.produced))
	require.Zero(t, s.count("outbox"), "the batch was finished before Run returned")
}

// A database that stops answering (a black hole between the relay and
// PostgreSQL) holds neither the relay nor its Close past their bounds; the
// relay counts it, and relays again once the database answers.
func TestABlackHoledDatabaseHoldsNeitherTheRelayNorItsClose(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	proxy, viaProxy := testenv.ProxyPostgres(t)
	store, err := sluicesql.NewOutbox(viaProxy, sluicesql.OutboxConfig{Table: s.schema + ".outbox"})
	require.NoError(t, err)
	meter := sdkmetric.NewManualReader()
	// StoreTimeout bounds each store call, and the relay must get through
	// once the database answers: after the heal's reset, a dial through
	// the proxy and Due's statements, which a loaded machine can take
	// longer than 200 ms for.
	r, err := outbox.NewRelay(store, s.rabbit.Publisher(), outbox.RelayConfig{PollInterval: 10 * time.Millisecond, RetryMin: 20 * time.Millisecond,
		Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(meter)), StoreTimeout: 3 * time.Second, PublishTimeout: time.Second}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	proxy.BlackHole()
	require.Eventually(t, func() bool {
		return testenv.CounterWhere(t, meter, telemetry.MetricOutboxFailures, "error.type", "store") >= 2
	},
		2*time.Minute, 10*time.Millisecond, "each read that got no answer is given up and counted")
	proxy.Heal()
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage(watermill.NewUUID(), nil)))
	require.NoError(t, tx.Commit())
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, s.conn, s.produced) == 1 }, 2*time.Minute, 10*time.Millisecond,
		"relayed once the database answers")
	proxy.BlackHole()
	require.Eventually(t, func() bool {
		return testenv.CounterWhere(t, meter, telemetry.MetricOutboxFailures, "error.type", "store") >= 4
	},
		2*time.Minute, 10*time.Millisecond)
	require.NoError(t, r.Close(), "Close returns although a store call hangs")
	require.NoError(t, <-done)
	proxy.Heal() // the calls given up return, and end
}

// unreachableFirst fails the first n publishes as a broker that refuses
// connections does.
type unreachableFirst struct {
	pub message.Publisher
	n   atomic.Int64
}

func (u *unreachableFirst) Publish(topic string, msgs ...*message.Message) error {
	if u.n.Add(-1) >= 0 {
		return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	return u.pub.Publish(topic, msgs...)
}
func (u *unreachableFirst) Close() error { return nil }

// While the broker cannot be reached, rows are not pushed back by their
// retry backoff (an hour here): they go as soon as it answers.
func TestAnUnreachableBrokerDoesNotPushRowsBack(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	pub := &unreachableFirst{pub: s.rabbit.Publisher()}
	pub.n.Store(20)
	s.relay(pub, outbox.RelayConfig{RetryMin: 40 * time.Millisecond, RetryMax: time.Hour, PollInterval: time.Hour})
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage(watermill.NewUUID(), nil)))
	require.NoError(t, tx.Commit())
	s.outbox.Wake()
	require.Len(t, s.producedMessages(1), 1)
	require.Equal(t, int64(20), testenv.CounterWhere(t, s.meter, telemetry.MetricOutboxFailures, "error.type", "unreachable"))
}

// An outage spends none of a row's attempts (RelayConfig.MaxAttempts
// counts the broker's refusals): a row to a queue that does not exist,
// relayed through an outage of 20 publishes no broker answered, then
// refused, is set aside as dead at its third refusal, not at its first.
// Before, the store counted the outage's failures too, and the first
// refusal after it found 20 attempts spent: dead after 1 refusal of 3.
func TestAnOutageSpendsNoAttemptOfARow(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	missing := testenv.Name("missing")
	testenv.DeleteQueuesAtEnd(t, missing)
	pub := &unreachableFirst{pub: s.rabbit.Publisher()}
	pub.n.Store(20)
	r := s.relay(pub, outbox.RelayConfig{RetryMin: 20 * time.Millisecond, RetryMax: 40 * time.Millisecond, PollInterval: 10 * time.Millisecond, MaxAttempts: 3})
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.outbox.Write(t.Context(), tx, missing, message.NewMessage(watermill.NewUUID(), nil)))
	require.NoError(t, tx.Commit())
	s.outbox.Wake()
	require.Eventually(t, func() bool { st, err := s.outbox.Stats(t.Context()); return err == nil && st.Dead == 1 }, 2*time.Minute, 10*time.Millisecond)
	require.NoError(t, r.Close()) // the counters below are added once Run has returned
	require.Equal(t, int64(20), testenv.CounterWhere(t, s.meter, telemetry.MetricOutboxFailures, "error.type", "unreachable"))
	require.Equal(t, int64(3), testenv.CounterWhere(t, s.meter, telemetry.MetricOutboxFailures, "error.type", "refused"),
		"dead at its third refusal: the outage's 20 failures spent no attempt")
}

// A batch whose rows were all refused (the broker answered: unroutable)
// does not make the relay back off: the refused rows wait for their own next
// attempt, and a row committed after them is relayed on its wake-up. Before,
// the relay slept RetryMin/16 unwoken — here (RetryMin an hour) 3m45s.
// Found by the CLI's tests.
func TestARefusedBatchDoesNotHoldTheRelay(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	missing := testenv.Name("missing")
	testenv.DeleteQueuesAtEnd(t, missing)
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{PollInterval: time.Hour, RetryMin: time.Hour, RetryMax: time.Hour})
	write := func(topic string) {
		tx, err := s.db.BeginTxx(t.Context(), nil)
		require.NoError(t, err)
		require.NoError(t, s.outbox.Write(t.Context(), tx, topic, message.NewMessage("m-"+topic, nil)))
		require.NoError(t, tx.Commit())
		s.outbox.Wake()
	}
	write(missing)
	require.Eventually(t, func() bool { st, err := s.outbox.Stats(t.Context()); return err == nil && st.Failing == 1 }, 2*time.Minute, 10*time.Millisecond)
	write(s.produced)
	require.Len(t, s.producedMessages(1), 1, "relayed on its wake-up")
}

// The relay's clock is not the database's: a failed row's next attempt and
// RetryNow are computed on the clock Due compares with.
func TestRetryNowMakesRowsDueOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.outbox.Write(t.Context(), tx, "t", message.NewMessage("m", nil)))
	require.NoError(t, tx.Commit())
	b, err := s.outbox.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	require.Len(t, b.Rows(), 1)
	require.NoError(t, b.Finish(t.Context(), nil, []outbox.Failed{{ID: b.Rows()[0].ID, Err: "refused", NextAttempt: time.Now().Add(time.Hour)}}))
	var inAnHour bool
	require.NoError(t, s.db.Get(&inAnHour, `SELECT next_attempt_at BETWEEN clock_timestamp() + interval '59 minutes' AND clock_timestamp() + interval '61 minutes' FROM `+s.schema+`.outbox`))
	require.True(t, inAnHour)
	n, err := s.outbox.RetryNow(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	var due bool
	require.NoError(t, s.db.Get(&due, `SELECT next_attempt_at <= clock_timestamp() FROM `+s.schema+`.outbox`))
	require.True(t, due)
}

// A row that cannot be read back as a message (its metadata altered by
// hand) is kept aside with its error, counted, and stops nothing.
func TestAnUnreadableRowIsKeptAsideAndStopsNothing(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	msgs := make([]*message.Message, 5)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprint("m-", i), nil)
	}
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, msgs...))
	require.NoError(t, tx.Commit())
	_, err = s.db.Exec(`UPDATE ` + s.schema + `.outbox SET metadata = '\xdeadbeef' WHERE message_id = 'm-2'`)
	require.NoError(t, err)
	s.relay(s.rabbit.Publisher(), outbox.RelayConfig{RetryMin: time.Hour, RetryMax: time.Hour})
	require.Len(t, s.producedMessages(4), 4)
	require.Eventually(t, func() bool {
		return testenv.CounterWhere(t, s.meter, telemetry.MetricOutboxFailures, "error.type", "unreadable") == 1
	}, 2*time.Minute, 10*time.Millisecond)
	var left []sluicesql.OutboxEntry
	require.Eventually(t, func() bool { // the failure is counted before its batch is recorded
		left, err = s.outbox.List(t.Context(), sluicesql.OutboxFailing, 10)
		require.NoError(t, err)
		return len(left) == 1
	}, 2*time.Minute, 10*time.Millisecond)
	require.Equal(t, "m-2", left[0].MessageID)
	require.Contains(t, left[0].LastError, "metadata")
}

// slowPublisher is a broker whose confirms take d: a fault, not a wait.
type slowPublisher struct {
	pub   message.Publisher
	d     time.Duration
	calls atomic.Int64
}

func (p *slowPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.calls.Add(1)
	time.Sleep(p.d)
	return p.pub.Publish(topic, msgs...)
}
func (p *slowPublisher) Close() error { return nil }

// A server whose idle_in_transaction_session_timeout is shorter than a
// batch's publishes would end the relay's transaction after them, and the
// rows would be sent again and again: the relay's transaction turns it off
// for itself. Before, the one row here was published over and over.
func TestAnIdleInTransactionTimeoutDoesNotResendTheBatch(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	sep := "?"
	if strings.Contains(testenv.PostgresURL, "?") {
		sep = "&"
	}
	strict, err := sqlx.Connect("postgres", testenv.PostgresURL+sep+"options=-c%20idle_in_transaction_session_timeout%3D100")
	require.NoError(t, err)
	t.Cleanup(func() { _ = strict.Close() })
	store, err := sluicesql.NewOutbox(strict, sluicesql.OutboxConfig{Table: s.schema + ".outbox"})
	require.NoError(t, err)
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage("only", nil)))
	require.NoError(t, tx.Commit())
	pub := &slowPublisher{pub: s.rabbit.Publisher(), d: 400 * time.Millisecond}
	r, err := outbox.NewRelay(store, pub, outbox.RelayConfig{PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	require.Eventually(t, func() bool { return s.count("outbox") == 0 }, 2*time.Minute, 10*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.Equal(t, int64(1), pub.calls.Load(), "published once")
	require.Equal(t, 1, testenv.QueueDepth(t, s.conn, s.produced))
}

// lagging is the outbox whose database clock is a little behind the
// relay's: the first look for a row due again finds nothing yet.
type lagging struct {
	outbox.Store
	armed atomic.Bool
}

type emptyBatch struct{}

func (emptyBatch) Rows() []outbox.Row                                     { return nil }
func (emptyBatch) Finish(context.Context, []int64, []outbox.Failed) error { return nil }
func (emptyBatch) Release(context.Context) error                          { return nil }
func (emptyBatch) CutShort() bool                                         { return false }

func (l *lagging) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	if l.armed.CompareAndSwap(true, false) {
		return emptyBatch{}, nil
	}
	return l.Store.Due(ctx, limit, maxBytes)
}

// A failed row the relay wakes for but finds not yet due (the database's
// clock, which decides, a little behind) is looked for again shortly after,
// not left to the next poll. Before, the relay then slept its PollInterval
// (an hour here): CI saw the produced event never arrive.
func TestARetryNotYetDueOnTheDatabasesClockIsLookedForAgain(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	store := &lagging{Store: s.outbox}
	pub := &failFirst{pub: s.rabbit.Publisher()}
	pub.n.Store(1)
	armOnFailure := &armingPublisher{pub: pub, arm: &store.armed}
	r, err := outbox.NewRelay(store, armOnFailure, outbox.RelayConfig{PollInterval: time.Hour, RetryMin: 50 * time.Millisecond})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, message.NewMessage("m", nil)))
	require.NoError(t, tx.Commit())
	s.outbox.Wake()
	require.Len(t, s.producedMessages(1), 1)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
}

// armingPublisher arms the lagging store when a publish fails.
type armingPublisher struct {
	pub message.Publisher
	arm *atomic.Bool
}

func (a *armingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := a.pub.Publish(topic, msgs...)
	if err != nil {
		a.arm.Store(true)
	}
	return err
}
func (a *armingPublisher) Close() error { return nil }

// With Concurrency 2 a relay publishes a second batch while its first is
// held (its publishes not returned); with 1 it would wait.
func TestAConcurrentRelayPublishesABatchWhileAnotherIsHeld(t *testing.T) {
	t.Parallel()
	s := newService(t, testenv.AMQPURL)
	msgs := make([]*message.Message, 10)
	held := map[string]bool{}
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprint("m-", i), nil)
		if i < 5 { // the oldest rows: one batch of 5
			held[msgs[i].UUID] = true
		}
	}
	pub := &holding{pub: s.rabbit.Publisher(), held: held, started: make(chan struct{}), release: make(chan struct{})}
	s.relay(pub, outbox.RelayConfig{BatchSize: 5, Concurrency: 2})
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.outbox.Write(t.Context(), tx, s.produced, msgs...))
	require.NoError(t, tx.Commit())
	s.outbox.Wake()
	<-pub.started
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, s.conn, s.produced) == 5 }, 2*time.Minute, 10*time.Millisecond,
		"the other batch is published while the first is held")
	close(pub.release)
	require.Len(t, s.producedMessages(10), 10)
	require.Eventually(t, func() bool { return s.count("outbox") == 0 }, time.Minute, 10*time.Millisecond)
}
