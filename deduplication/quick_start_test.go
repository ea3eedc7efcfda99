package deduplication_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/stage"
)

// quickStart runs the README's quick start (addInventory) on RabbitMQ and
// PostgreSQL, its queue the README's order.created (deleted before and
// after: the tests that use it do not run in parallel), and returns the
// lines it logged, a channel to publish into the queue with, and the
// reservations made (-1 while the queue holds messages).
func quickStart(t *testing.T, setup ...string) (*testenv.Log, publisher, func() int) {
	return quickStartOn(t, nil, setup...)
}

// quickStartOn is quickStart on a router that has mws, the middlewares a
// team's router has already, outside the quick start's, and the SQL of
// setup run after the reservations table is created.
func quickStartOn(t *testing.T, mws []message.HandlerMiddleware, setup ...string) (*testenv.Log, publisher, func() int) {
	t.Helper()
	db := testenv.PostgresInSchema(t)
	for _, q := range append([]string{`CREATE TABLE reservations (order_id TEXT NOT NULL)`}, setup...) {
		_, err := db.ExecContext(t.Context(), q)
		require.NoError(t, err)
	}
	testenv.DeleteQueuesNowAndAtEnd(t, "order.created")
	log := testenv.NewLog()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, log)
	require.NoError(t, err)
	r.AddMiddleware(mws...)
	require.NoError(t, addInventory(t.Context(), r, testenv.AMQPURL, db, log))
	done := runRouter(r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	reservations := func() int {
		var n int
		require.NoError(t, db.GetContext(t.Context(), &n, `SELECT count(*) FROM reservations`))
		return n
	}
	conn := testenv.AMQP(t)
	return log, testenv.Channel(t, conn), func() int {
		if testenv.QueueDepth(t, conn, "order.created") > 0 {
			return -1
		}
		return reservations()
	}
}

// publisher is an AMQP channel, as testenv.Channel opens it.
type publisher interface {
	PublishWithContext(ctx context.Context, exchange, key string, mandatory, immediate bool, msg amqp091.Publishing) error
}

// publishRaw publishes body with headers to queue, as a foreign producer
// does.
func publishRaw(t *testing.T, ch publisher, queue, body string, headers amqp091.Table) {
	t.Helper()
	require.NoError(t, ch.PublishWithContext(t.Context(), "", queue, false, false, amqp091.Publishing{Body: []byte(body), Headers: headers}))
}

// The README's quick start runs as written: three deliveries of one event
// reserve once, and an event from a Spring producer with an integer header
// (schemaVersion int32) is processed, not nacked in a loop — the snippet
// builds its subscriber with rabbitmq.WithMarshaler. It says, once, what
// its stack lacks (no poison stage, no retry tiers), and nothing of the
// marshaler. Before, the snippet left its subscriber undefined, and the
// subscriber a team took (watermill-amqp's DefaultMarshaler) looped on the
// integer header (31,979 log lines in 6 s).
func TestTheREADMEQuickStartRuns(t *testing.T) {
	log, ch, reservations := quickStart(t)
	for range 3 {
		publishRaw(t, ch, "order.created", `{"eventId":"evt-1"}`, nil)
	}
	publishRaw(t, ch, "order.created", `{"eventId":"evt-2"}`, amqp091.Table{"schemaVersion": int32(3), "__TypeId__": "com.example.OrderCreated"})
	require.Eventually(t, func() bool { return reservations() == 2 }, 2*time.Minute, 10*time.Millisecond, "evt-1 reserved once, evt-2 (a Spring producer's) too")
	require.Empty(t, log.Lines("Handler returned error"), "nothing looped")
	require.Len(t, log.Lines("has no stage outside it"), 1, "what the quick start lacks, said once")
	require.Contains(t, log.Lines("has no stage outside it")[0].Text(), "poison.New")
	require.Empty(t, log.Lines("without Sluice's rabbitmq.Marshaler"))
}

// failTheThirdInsert makes the third insert into reservations fail, once,
// as a serialization failure (SQLSTATE 40001: Transient).
var failTheThirdInsert = []string{
	`CREATE SEQUENCE inserts`,
	`CREATE FUNCTION fail_the_third() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('inserts') = 3 THEN
		RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001';
	END IF;
	RETURN NEW;
END $$`,
	`CREATE TRIGGER fail_the_third BEFORE INSERT ON reservations FOR EACH ROW EXECUTE FUNCTION fail_the_third()`,
}

// The quick start on a router that already has Watermill's own Timeout and
// Retry, as a team's router often does: Retry runs the whole stack again
// for a delivery whose reservation failed once (a serialization failure,
// SQLSTATE 40001: Transient), the inbox's claim was rolled back with it, so
// the retry reserves it — once; three copies of one event and a Spring
// producer's still reserve once each.
func TestTheREADMEQuickStartBehindWatermillsTimeoutAndRetry(t *testing.T) {
	tries, failedTries := observed()
	mws := []message.HandlerMiddleware{
		wmiddleware.Timeout(time.Minute),
		wmiddleware.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond, Logger: watermill.NopLogger{}}.Middleware,
		tries,
	}
	log, ch, reservations := quickStartOn(t, mws, failTheThirdInsert...)
	for range 3 {
		publishRaw(t, ch, "order.created", `{"eventId":"evt-1"}`, nil)
	}
	publishRaw(t, ch, "order.created", `{"eventId":"evt-2"}`, amqp091.Table{"schemaVersion": int32(3), "__TypeId__": "com.example.OrderCreated"})
	publishRaw(t, ch, "order.created", `{"eventId":"evt-3"}`, nil)
	require.Eventually(t, func() bool { return reservations() == 3 }, 2*time.Minute, 10*time.Millisecond, "three events, three reservations")
	failed := failedTries()
	require.Len(t, failed, 1, "one try failed")
	require.ErrorContains(t, failed[0], "40001")
	require.Empty(t, log.Lines("Handler returned error"), "the failure was retried in place, not nacked")
	// Nothing more arrives: every delivery was acked with the queue empty.
	require.Equal(t, 3, reservations(), "each event reserved once")
}

// observed returns a middleware and what the handlers it wraps returned
// when they failed.
func observed() (message.HandlerMiddleware, func() []error) {
	var mu sync.Mutex
	var failed []error
	return func(h message.HandlerFunc) message.HandlerFunc {
			return func(m *message.Message) ([]*message.Message, error) {
				out, err := h(m)
				if err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
				return out, err
			}
		}, func() []error {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(failed)
		}
}

// Watermill's Retry outside its Timeout: Timeout ends the context it gave
// a try when the try returns, and the next try's Timeout derives from that
// ended context, so every retry starts with its context ended. The inbox
// asks its store nothing on such a context and says so (context canceled):
// no "store did not answer" for the brake to count; Retry gives up, the
// delivery is nacked (the router logs nothing for context.Canceled) and
// its redelivery reserves it, once. Before, each retry began a unit of work
// on the ended context and, once its 100 ms grace passed on a loaded
// machine, reported the store as not answering within StoreTimeout
// (deduplication.ErrStoreTimeout in a *sluice.DependencyError).
func TestTheREADMEQuickStartBehindWatermillsRetryOutsideItsTimeout(t *testing.T) {
	observe, failedDeliveries := observed()
	mws := []message.HandlerMiddleware{
		observe,
		wmiddleware.Retry{MaxRetries: 2, InitialInterval: 10 * time.Millisecond, Logger: watermill.NopLogger{}}.Middleware,
		wmiddleware.Timeout(time.Minute),
	}
	_, ch, reservations := quickStartOn(t, mws, failTheThirdInsert...)
	for range 3 {
		publishRaw(t, ch, "order.created", `{"eventId":"evt-1"}`, nil)
	}
	publishRaw(t, ch, "order.created", `{"eventId":"evt-2"}`, nil)
	publishRaw(t, ch, "order.created", `{"eventId":"evt-3"}`, nil)
	require.Eventually(t, func() bool { return reservations() == 3 }, 2*time.Minute, 10*time.Millisecond, "three events, three reservations")
	require.Equal(t, 3, reservations(), "each event reserved once")
	failed := failedDeliveries()
	require.Len(t, failed, 1, "one delivery failed its tries, and was nacked")
	require.ErrorIs(t, failed[0], context.Canceled, "its retries failed on their ended context")
	require.NotErrorIs(t, failed[0], deduplication.ErrStoreTimeout, "no store outage reported")
	require.NotErrorIs(t, failed[0], sluice.ErrDependency, "nothing for the brake to count")
}

// A handler that reads watermill-amqp's subscriber with its DefaultMarshaler
// is named at its first delivery, once: the fix (rabbitmq.WithMarshaler)
// before a producer's integer header loops. Before, nothing said so.
func TestWatermillAMQPsDefaultMarshalerIsNamedOnce(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("default_marshaler")
	testenv.DeleteQueuesNowAndAtEnd(t, queue)
	log := testenv.NewLog()
	sub, err := amqp.NewSubscriber(amqp.NewDurableQueueConfig(testenv.AMQPURL), watermill.NopLogger{})
	require.NoError(t, err)
	classify, err := stage.Classify(stage.ClassifyConfig{Env: sluice.Env{Logger: log}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	handled := make(chan struct{}, 3)
	r.AddConsumerHandler("orders", queue, sub, func(*message.Message) error {
		handled <- struct{}{}
		return nil
	}).AddMiddleware(classify)
	done := runRouter(r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	ch := testenv.Channel(t, testenv.AMQP(t))
	for range 3 {
		publishRaw(t, ch, queue, `{}`, amqp091.Table{"source": "web"})
		<-handled
	}
	lines := log.Lines("without Sluice's rabbitmq.Marshaler")
	require.Len(t, lines, 1)
	require.Contains(t, lines[0].Text(), "rabbitmq.WithMarshaler")
	require.Equal(t, "orders", lines[0].Fields["handler"])
}

// A Poison failure in the quick start, which has no poison stage, loops —
// watermill-amqp requeues the nacked delivery at once — and the log says
// why: once per handler at its first delivery (no poison stage, no retry
// tiers), and, for the looping failure, a line that explains it at most
// once a minute however many times it recurs, with the count. Before, the
// log held only Watermill's "Handler returned error … poison: …", one per
// try (13,578 in 7 s), and nothing said what was missing.
func TestTheQuickStartExplainsAPoisonFailureNothingIsolates(t *testing.T) {
	log, ch, _ := quickStart(t)
	start := time.Now()
	publishRaw(t, ch, "order.created", `{"eventId":`, nil) // malformed: Poison at the key
	require.Eventually(t, func() bool { return len(log.Lines("Handler returned error")) >= 20 }, 2*time.Minute, 10*time.Millisecond,
		"the malformed delivery loops: nothing isolates it")
	tries := len(log.Lines("Handler returned error"))
	explained := log.Lines("failure, and no poison stage outside Classify to isolate it")
	require.NotEmpty(t, explained, "the looping failure is explained")
	require.LessOrEqual(t, len(explained), 1+int(time.Since(start)/time.Minute),
		"at most once a minute, not once per try (%d tries)", tries)
	require.Contains(t, explained[0].Text(), "poison.New")
	require.Contains(t, explained[0].Text(), `deduplication key: JSON field "eventId"`)
	require.Len(t, log.Lines("has no stage outside it"), 1, "the missing stages, said once for the handler")
}

// runRouter runs r until ctx ends or it is closed, returning Run's error on
// the channel.
func runRouter(r *message.Router) <-chan error {
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case <-time.After(30 * time.Second):
	}
	return done
}

// The README's quick start, followed literally, keeps processing behind a
// message whose header is an array of 9,000 items (RabbitMQ accepts it;
// amqp091-go refuses arrays past 8,192): the 20 events behind it are
// reserved once each, and the subscriber's connection is never closed.
// Before (watermill-amqp's connection through upstream amqp091-go, without
// Sluice's frame filter), the client closed the connection with
// FRAME_ERROR, the broker handed the same message back, and 0 of the 20
// were processed.
func TestTheREADMEQuickStartKeepsProcessingBehindAHugeHeaderArray(t *testing.T) {
	log, ch, reservations := quickStart(t)
	publishRaw(t, ch, "order.created", `{"eventId":"evt-hostile"}`, amqp091.Table{"arr": make([]any, 9000)})
	for i := range 20 {
		publishRaw(t, ch, "order.created", fmt.Sprintf(`{"eventId":"evt-good-%d"}`, i), nil)
	}
	// The hostile event reaches the handler with its headers dropped (the
	// quick start has no poison stage), so 21 reservations.
	require.Eventually(t, func() bool { return reservations() == 21 }, time.Minute, 10*time.Millisecond, "the 20 events behind it processed")
	require.Empty(t, log.Lines("Received close notification from AMQP, reconnecting"), "no reconnect")
}
