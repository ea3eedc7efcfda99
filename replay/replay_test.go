package replay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pgStore(t *testing.T) *sluicesql.Outcomes {
	t.Helper()
	db := testenv.Postgres(t)
	return testenv.OutcomeStore(t, db, testenv.Schema(t, db)+".sluice_replay")
}

// serveOrders runs handler as "orders" on an embedded broker with one tier
// of delay until t ends: behind the stages given (Replay, MeterProvider, an
// inbox), poison, retry, classify and, unless given, a memory inbox, with
// outer as router middlewares outside them.
func serveOrders(t *testing.T, delay time.Duration, stages router.Stages, handler message.NoPublishHandlerFunc, outer ...message.HandlerMiddleware) *embedded.Broker {
	t.Helper()
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{delay}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(outer...)
	stages.Poison, stages.Retry, stages.Classify = &poison.Config{}, &retrytiers.Config{}, &stage.ClassifyConfig{}
	if stages.Inbox == nil {
		stages.Inbox = &deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "orders"}
	}
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "orders", Handler: handler, Stages: stages})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done); _ = e.Close() })
	return e
}

// The stage records each replayed delivery's fate as the stages inside
// decided it: processed, a duplicate the inbox skipped (which does not
// replace processed), poisoned again with the new reason, retried into a
// tier; deliveries of no replay run are not recorded.
func TestOutcomesOfAReplayRun(t *testing.T) {
	t.Parallel()
	store := pgStore(t)
	handled := make(chan string, 10)
	reader := sdkmetric.NewManualReader()
	e := serveOrders(t, time.Hour, router.Stages{
		Env:    sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		Replay: &replay.Config{Store: store},
	}, func(msg *message.Message) error {
		defer func() { handled <- msg.Metadata.Get(replay.ItemKey) }()
		switch msg.Metadata.Get(sluice.EventIDKey) {
		case "still-bad":
			return sluice.Poison(errors.New("unknown version 9"))
		case "flaky":
			return sluice.Transient(errors.New("stock service timeout"))
		}
		return nil
	})

	publish := func(run, id string) {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, id)
		if run != "" {
			m.Metadata.Set(replay.RunKey, run)
			m.Metadata.Set(replay.ItemKey, id)
		}
		require.NoError(t, e.PubSub().Publish("orders", m))
		<-handled
	}
	publish("run-1", "ok")
	publish("run-1", "still-bad")
	publish("run-1", "flaky")
	publish("", "unrelated")
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`)) // "ok" again: the inbox skips the handler
	m.Metadata.Set(sluice.EventIDKey, "ok")
	m.Metadata.Set(replay.RunKey, "run-1")
	m.Metadata.Set(replay.ItemKey, "ok")
	require.NoError(t, e.PubSub().Publish("orders", m))
	publish("run-1", "last") // handled in order: after the duplicate

	// Every record written — five, the duplicate's among them: the stage
	// counts each just after writing it. (Waiting for four items instead
	// could read the duplicate's record before the first delivery's, which
	// the handler's signal does not order.)
	require.Eventually(t, func() bool { return testenv.CounterSum(t, reader, telemetry.MetricReplayOutcomes) == 5 },
		time.Minute, 5*time.Millisecond, "five outcomes recorded")
	rs, err := store.Outcomes(t.Context(), "run-1")
	require.NoError(t, err)
	got := map[string]replay.Record{}
	for _, r := range rs {
		got[r.Item] = r
	}
	require.Len(t, got, 4)
	require.Equal(t, sluice.OutcomeProcessed, got["ok"].Outcome, "the duplicate did not replace processed")
	require.Equal(t, sluice.OutcomePoisoned, got["still-bad"].Outcome)
	require.Equal(t, "poison", got["still-bad"].Class)
	require.Contains(t, got["still-bad"].Reason, "unknown version 9")
	require.Equal(t, sluice.OutcomeRetried, got["flaky"].Outcome)
	require.False(t, ledger.Final(got["flaky"].Outcome))
	require.Equal(t, "orders", got["ok"].Handler)
	all, err := store.Outcomes(t.Context(), "")
	require.NoError(t, err)
	require.Len(t, all, 4, "a delivery of no replay run is not recorded")
	for outcome, n := range map[string]int64{"processed": 2, "duplicate": 1, "poisoned": 1, "retried": 1} {
		require.Eventually(t, func() bool { // counted just after the record is written
			return testenv.CounterWhere(t, reader, telemetry.MetricReplayOutcomes, string(telemetry.AttrOutcome), outcome) == n
		}, time.Minute, 5*time.Millisecond, outcome)
	}
	require.Equal(t, []string{"orders"}, testenv.AttributeValues(t, reader, telemetry.MetricReplayOutcomes, "messaging.consumer.group.name"))
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricReplayRecordFailures))
}

// Replayed marks items sent; it never replaces an outcome already there.
func TestReplayedKeepsAnOutcome(t *testing.T) {
	t.Parallel()
	store := pgStore(t)
	now := time.Now()
	require.NoError(t, store.Record(t.Context(), replay.Record{Run: "r", Item: "a", Outcome: sluice.OutcomeProcessed, At: now}))
	require.NoError(t, store.Replayed(t.Context(), []replay.Record{{Run: "r", Item: "a", At: now}, {Run: "r", Item: "b", EventID: "evt-b", At: now}}))
	rs, err := store.Outcomes(t.Context(), "r")
	require.NoError(t, err)
	require.Len(t, rs, 2)
	require.Equal(t, sluice.OutcomeProcessed, rs[0].Outcome)
	require.Equal(t, ledger.OutcomeReplayed, rs[1].Outcome)
	require.Equal(t, "evt-b", rs[1].EventID)
	final, poisoned := replayledger.Count(rs, map[string]bool{"a": true, "b": true})
	require.Equal(t, 1, final)
	require.Zero(t, poisoned)
}

func TestConfigAndTableErrors(t *testing.T) {
	t.Parallel()
	_, err := replay.New(replay.Config{})
	require.ErrorContains(t, err, "Config.Store is required")
	// A negative StoreTimeout given once to every stage (router.Stages.Env)
	// is refused by the stage where it is not the inbox's, naming the field
	// where it was set.
	_, err = replay.New(replay.Config{Store: failing{}, Env: sluice.Env{StoreTimeout: -1}})
	require.ErrorContains(t, err, "Env.StoreTimeout (the stage's own or router.Stages' and service.Config's shared Env) must not be negative")
	require.ErrorContains(t, err, "the inbox's alone")
}

// With Config.InUnitOfWork the "processed" outcome is written in the inbox's
// transaction: it exists whenever the business row does, even when the
// outer record fails (here: a record timeout of 1 ns). Without it, the
// same failure leaves the item without its outcome.
func TestProcessedInTheInboxTransaction(t *testing.T) {
	t.Parallel()
	for _, inTx := range []bool{true, false} {
		db := testenv.Postgres(t)
		schema := testenv.Schema(t, db)
		_, err := db.Exec(`CREATE TABLE ` + schema + `.stock (event_id TEXT NOT NULL)`)
		require.NoError(t, err)
		inbox := testenv.SQLStore(t, db, schema+".inbox")
		outcomes := testenv.OutcomeStore(t, db, schema+".sluice_replay")
		reader := sdkmetric.NewManualReader()
		cfg := &replay.Config{Store: outcomes, Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), StoreTimeout: time.Nanosecond}}
		if inTx {
			cfg.InUnitOfWork = true
		}
		e, err := embedded.New(embedded.Config{Topic: "stock", TierDelays: []time.Duration{time.Hour}})
		require.NoError(t, err)
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
		require.NoError(t, err)
		_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "stock", Handler: func(msg *message.Message) error {
			_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), `INSERT INTO `+schema+`.stock (event_id) VALUES ($1)`, msg.Metadata.Get(sluice.EventIDKey))
			return err
		}, Stages: router.Stages{Replay: cfg, Classify: &stage.ClassifyConfig{}, Inbox: &deduplication.Config{Store: inbox, Consumer: "stock"}}})
		require.NoError(t, err)
		done := testenv.RunRouter(context.Background(), r)
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, "evt-1")
		m.Metadata.Set(replay.RunKey, "run-1")
		m.Metadata.Set(replay.ItemKey, "evt-1")
		require.NoError(t, e.PubSub().Publish("stock", m))
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM `+schema+`.stock`))
			return n == 1
		}, time.Minute, 5*time.Millisecond)
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
		require.NoError(t, e.Close())
		rs, err := outcomes.Outcomes(t.Context(), "run-1")
		require.NoError(t, err)
		require.Equal(t, int64(1), testenv.CounterSum(t, reader, telemetry.MetricReplayRecordFailures), "the outer record timed out, counted")
		if inTx {
			require.Len(t, rs, 1, "written with the business row")
			require.Equal(t, sluice.OutcomeProcessed, rs[0].Outcome)
		} else {
			require.Empty(t, rs, "the control: the outer record timed out")
		}
	}
	_, err := replay.New(replay.Config{Store: failing{}, InUnitOfWork: true})
	require.ErrorContains(t, err, "Config.InUnitOfWork needs a Config.Store that can record in the inbox's unit of work")
	mw, err := replay.InTx(replay.Config{Store: failing{}})
	require.NoError(t, err)
	require.Nil(t, mw, "no InTx without Config.InUnitOfWork")
}

type failing struct{}

func (failing) Record(context.Context, replay.Record) error { return errors.New("down") }

// Behind Watermill's Timeout on the router, a replayed delivery whose first
// attempt outlasts the deadline is parked in a tier ("retried": not final),
// keeps its run and item through the tier, and is recorded "processed" when
// it comes back: the closed loop sees its final outcome.
func TestRetriedBehindWatermillTimeoutEndsProcessed(t *testing.T) {
	t.Parallel()
	store := pgStore(t)
	attempts := make(chan string, 10)
	e := serveOrders(t, 100*time.Millisecond, router.Stages{Replay: &replay.Config{Store: store}}, func(msg *message.Message) error {
		attempts <- msg.Metadata.Get(replay.RunKey)
		if msg.Metadata.Get(sluice.AttemptKey) == "" { // the first attempt is slow
			select {
			case <-msg.Context().Done():
				return msg.Context().Err()
			case <-time.After(5 * time.Second):
			}
		}
		return nil
	}, wmiddleware.Timeout(100*time.Millisecond))

	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "slow-1")
	m.Metadata.Set(replay.RunKey, "run-1")
	m.Metadata.Set(replay.ItemKey, "slow-1")
	require.NoError(t, e.PubSub().Publish("orders", m))
	require.Equal(t, "run-1", <-attempts)
	require.Equal(t, "run-1", <-attempts, "the tier copy keeps the run")
	require.Eventually(t, func() bool {
		rs, err := store.Outcomes(t.Context(), "run-1")
		require.NoError(t, err)
		return len(rs) == 1 && rs[0].Outcome == sluice.OutcomeProcessed
	}, time.Minute, 10*time.Millisecond, "processed after the tier, replacing retried")
}

// A replayed delivery whose handler aborts the inbox's transaction (a unique
// violation, SQLSTATE 23505: Poison) is recorded "poisoned" with the
// database's reason, and no "processed" is written in the transaction that
// rolled back.
func TestAbortedTransactionIsRecordedPoisoned(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(`CREATE TABLE ` + schema + `.stock (event_id TEXT PRIMARY KEY)`)
	require.NoError(t, err)
	outcomes := testenv.OutcomeStore(t, db, schema+".sluice_replay")
	e := serveOrders(t, time.Hour, router.Stages{
		Replay: &replay.Config{Store: outcomes, InUnitOfWork: true},
		Inbox:  &deduplication.Config{Store: testenv.SQLStore(t, db, schema+".inbox"), Consumer: "orders"},
	}, func(msg *message.Message) error {
		tx := sluicesql.TxFromContext(msg.Context())
		for range 2 { // the second insert violates the key and aborts the transaction
			if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+schema+`.stock (event_id) VALUES ('x')`); err != nil {
				return err
			}
		}
		return nil
	})
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-dup")
	m.Metadata.Set(replay.RunKey, "run-1")
	m.Metadata.Set(replay.ItemKey, "evt-dup")
	require.NoError(t, e.PubSub().Publish("orders", m))
	var got []replay.Record
	require.Eventually(t, func() bool {
		got, err = outcomes.Outcomes(t.Context(), "run-1")
		require.NoError(t, err)
		return len(got) == 1
	}, time.Minute, 10*time.Millisecond)
	require.Equal(t, sluice.OutcomePoisoned, got[0].Outcome)
	require.Equal(t, "poison", got[0].Class)
	require.Contains(t, got[0].Reason, "23505")
	var rows int
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM `+schema+`.stock`))
	require.Zero(t, rows, "the first insert rolled back with the transaction")
	require.Len(t, e.Poisoned(), 1)
}
