package router_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// The ordered handler as users compose it: behind Watermill's Timeout and
// Retry on the router, fed by a foreign producer (AMQP properties, a typed
// header, a forged sluice_attempt), on a classic queue and on a quorum
// queue with a delivery limit. Account a's second message outlives the
// deadline once and comes back from the tier; its three later messages,
// held meanwhile, run after it, in order, each once, with the producer's
// properties and headers as they came, the forged attempt not believed,
// and a deadline of their own (with a-1's, what a-1's run left, a released
// message under load failed into a tier: attempt 2); account b flows. On the quorum queue no delivery spent its limit.
func TestAnOrderedHandlerBehindWatermillsTimeoutWithAForeignProducer(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		t.Run(fmt.Sprintf("quorum %v", quorum), func(t *testing.T) {
			t.Parallel()
			orderedBehindTimeout(t, quorum)
		})
	}
}

// composeTimeout is the router's Watermill Timeout in
// orderedBehindTimeout.
const composeTimeout = 10 * time.Second

type orderedRun struct {
	id, correlation, typ string
	attempt              int
	deadline             time.Time // its context's
}

func orderedBehindTimeout(t *testing.T, quorum bool) {
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	_, err := db.Exec(`CREATE TABLE ` + schema + `.applied (n bigserial PRIMARY KEY, event_id text NOT NULL)`)
	require.NoError(t, err)
	inbox, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".inbox"})
	require.NoError(t, err)
	require.NoError(t, inbox.CreateTable(t.Context()))
	orders := testenv.Migrate(t, db, sluicesql.Config{Schema: schema, Order: sluicesql.OrdersConfig{TablePrefix: "sluice_order"}}).Order

	tc := rabbitmq.TopologyConfig{Queue: testenv.Name("ordered_compose"), TierDelays: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}}
	if quorum {
		tc.Quorum, tc.DeliveryLimit = true, 5
	}
	topo, err := rabbitmq.NewTopology(tc)
	require.NoError(t, err)
	var names []string
	for _, q := range topo.Queues() {
		names = append(names, q.Name)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: tc})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })

	var mu sync.Mutex
	var runs []orderedRun
	timedOut := false
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	// Watermill's Timeout ends a-1's first run, which waits for it; every
	// other run must end well inside it, on a loaded machine too (at 2 s, a
	// run of b-0 under load average 20 outlived it and went to a tier).
	r.AddMiddleware(wmiddleware.Retry{MaxRetries: 2, InitialInterval: 10 * time.Millisecond}.Middleware, wmiddleware.Timeout(composeTimeout))
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b, Name: "ledger",
		Handler: func(msg *message.Message) error {
			attempt, err := sluice.Attempt(msg)
			if err != nil {
				return err
			}
			id := msg.Metadata.Get(sluice.EventIDKey)
			mu.Lock()
			deadline, _ := msg.Context().Deadline()
			runs = append(runs, orderedRun{id: id, correlation: msg.Metadata.Get(metakeys.PropertyCorrelationID), typ: msg.Metadata.Get("__TypeId__"), attempt: attempt, deadline: deadline})
			first := id == "a-1" && !timedOut
			timedOut = timedOut || first
			mu.Unlock()
			if first {
				<-msg.Context().Done() // the ledger service never answers: Watermill's Timeout ends the run
				return msg.Context().Err()
			}
			_, err = sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), `INSERT INTO `+schema+`.applied (event_id) VALUES ($1)`, id)
			return err
		},
		Stages: router.Stages{
			Env:       sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))},
			Trace:     &stage.TraceConfig{},
			Order:     &ordering.Config{Store: orders, Key: sluice.KeyFromMetadata("account")},
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: inbox},
			Recoverer: &stage.RecovererConfig{},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })

	// A Spring-like producer: its properties, a typed header, and a
	// header that looks like Sluice's own.
	ch := testenv.Channel(t, testenv.AMQP(t))
	for i := range 5 {
		for _, acct := range []string{"a", "b"} {
			id := fmt.Sprintf("%s-%d", acct, i)
			require.NoError(t, ch.PublishWithContext(t.Context(), "", tc.Queue, false, false, amqp.Publishing{
				ContentType: "application/json", CorrelationId: "corr-" + id, MessageId: "m-" + id, DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{sluice.EventIDKey: id, "account": acct, "__TypeId__": "com.example.Debit", sluice.AttemptKey: "4"},
				Body:    []byte(`{"amount":10}`),
			}))
		}
	}
	applied := func(acct string) []string {
		var ids []string
		require.NoError(t, db.Select(&ids, `SELECT event_id FROM `+schema+`.applied WHERE event_id LIKE $1 ORDER BY n`, acct+"-%"))
		return ids
	}
	require.Eventually(t, func() bool { return len(applied("a")) == 5 && len(applied("b")) == 5 }, 60*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{"a-0", "a-1", "a-2", "a-3", "a-4"}, applied("a"), "a-1 came back from its tier; a-2..a-4 waited for it")
	require.Equal(t, []string{"b-0", "b-1", "b-2", "b-3", "b-4"}, applied("b"))
	mu.Lock()
	defer mu.Unlock()
	ran := map[string]int{}
	var head time.Time // the deadline of a-1's run back from the tier
	for _, s := range runs {
		ran[s.id]++
		require.False(t, s.deadline.IsZero(), "%s ran behind Watermill's Timeout", s.id)
		switch {
		case s.id == "a-1":
			head = s.deadline
		case strings.HasPrefix(s.id, "a-"):
			// a-2..a-4 were held and released by a-1's run: each had
			// Timeout's composeTimeout of its own, not what a-1's run left.
			require.True(t, s.deadline.After(head), "%s (released) ran with a deadline of its own: %s, a-1's %s", s.id, s.deadline, head)
		}
		require.Equal(t, "corr-"+s.id, s.correlation, "%s: the producer's correlation id, held or not", s.id)
		require.Equal(t, "com.example.Debit", s.typ, "%s: the producer's typed header", s.id)
		if s.id != "a-1" {
			require.Equal(t, 1, s.attempt, "%s: the forged sluice_attempt=4 is not believed (runs: %+v)", s.id, runs)
		}
	}
	require.Equal(t, 2, ran["a-1"], "the timed-out run and its copy back from the tier")
	for _, id := range []string{"a-2", "a-3", "a-4", "b-1"} {
		require.Equal(t, 1, ran[id], "%s ran once", id)
	}
	// The key's last release commits after the inbox committed a-4.
	require.Eventually(t, func() bool {
		keys, err := orders.Keys(t.Context(), "ledger", 10)
		require.NoError(t, err)
		return len(keys) == 0
	}, time.Minute, 20*time.Millisecond, "no key waits")
	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, topo.Config().PoisonQueue), "nothing dead-lettered by a delivery limit or poisoned")

	// Every delivery and every released message has its span and its
	// outcome, under the handler's name: a-1 retried then processed, a-2..a-4
	// waiting (held) then processed (released), the rest processed.
	outcomes := map[string][]string{}
	for _, s := range spans.Ended() {
		require.Equal(t, "ledger", attr(s, "messaging.consumer.group.name"))
		id := attr(s, string(telemetry.AttrEventID))
		outcomes[id] = append(outcomes[id], attr(s, string(telemetry.AttrOutcome)))
	}
	want := map[string][]string{"a-1": {"retried", "processed"}}
	for i := range 5 {
		want[fmt.Sprintf("b-%d", i)] = []string{"processed"}
		if i != 1 {
			want[fmt.Sprintf("a-%d", i)] = []string{"processed"}
		}
		if i >= 2 {
			want[fmt.Sprintf("a-%d", i)] = []string{"waiting", "processed"}
		}
	}
	require.Equal(t, want, outcomes)
	for outcome, n := range map[string]int64{"processed": 10, "retried": 1, "waiting": 3} {
		require.Equal(t, n, testenv.CounterWhere(t, reader, telemetry.MetricConsumed, string(telemetry.AttrOutcome), outcome), outcome)
	}
	require.Equal(t, []string{"ledger"}, testenv.AttributeValues(t, reader, telemetry.MetricConsumed, "messaging.consumer.group.name"))
}
