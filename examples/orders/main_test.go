package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// check compares the summary — read from the stores, the queues and
// Sluice's metrics — with what the script must end in.
func check(t *testing.T, s *summary) {
	t.Helper()
	require.Equal(t, 11, s.Published)
	require.Equal(t, []string{"o-1", "o-2", "o-3", "o-5", "o-6"}, s.Reserved, "each accepted order reserved exactly once")
	require.Equal(t, []string{"o-4: out of stock"}, s.Rejected)
	require.Equal(t, 1, s.RejectionEvents, "the rejection event was published once")
	require.Equal(t, int64(1), s.Relayed, "the rejection event went through the outbox")
	require.Zero(t, s.OutboxRows, "the relay deleted it once the broker held it")
	require.Equal(t, 6, s.Inventory.Inbox, "5 reserved + 1 rejected; the poisoned ones rolled back")
	require.Equal(t, int64(3), s.Inventory.Duplicates)
	require.Equal(t, map[string]int64{"100ms": 2, "300ms": 1}, s.Inventory.Retried, "evt-3 once through tier 1; evt-5 through tiers 1 and 2")
	require.Len(t, s.Inventory.Poisoned, 2)
	require.Equal(t, poisonedRow{"invariant", "evt-7", "invariant: order o-404 must exist before its reservation"}, s.Inventory.Poisoned[0])
	require.Equal(t, "poison", s.Inventory.Poisoned[1].Class)
	require.Contains(t, s.Inventory.Poisoned[1].Reason, `JSON field "eventId": payload is not a JSON object`)
	require.Equal(t, "pass", s.Ready, "the service was ready while it ran")

	// The order log got every delivery too, the duplicates of evt-1, evt-2
	// and evt-4 among them: a row for each well-formed event, once (the
	// table has no unique constraint: the inbox alone left them out).
	require.Equal(t, []string{"evt-1", "evt-2", "evt-3", "evt-4", "evt-5", "evt-7", "evt-8"}, s.Logged, "each scripted event logged exactly once")
	require.Equal(t, 7, s.OrderLog.Inbox)
	require.Equal(t, int64(3), s.OrderLog.Duplicates, "the three duplicate deliveries left out by the inbox")
	require.Empty(t, s.OrderLog.Retried)
	require.Len(t, s.OrderLog.Poisoned, 1, "the malformed payload: its eventId cannot be read")
	require.Equal(t, s.Inventory.Poisoned[1], s.OrderLog.Poisoned[0])
	require.Equal(t, int64(7), s.Batched, "the batches committed the 7 events, each once")
	require.GreaterOrEqual(t, s.Batches, int64(1))
	require.LessOrEqual(t, s.Batches, int64(7))
	require.Zero(t, s.PendingRetries)
}

// exampleQueues are the queues and the exchange a servers-mode run named
// name declares, for testenv.DeleteQueuesAtEnd.
func exampleQueues(name string) []string {
	qs := []string{name + "." + rejectedTopic, "exchange:" + exchange(name)}
	for _, h := range handlers {
		q := name + "." + h
		qs = append(qs, q, q+".poison", q+".retry.100ms", q+".retry.300ms")
	}
	return qs
}

func TestExampleEmbedded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var spans bytes.Buffer
	s, err := run(ctx, config{DBPath: filepath.Join(t.TempDir(), "orders.db"), MetricsAddr: "unused", TraceOut: &spans})
	require.NoError(t, err)
	check(t, s)

	var out bytes.Buffer
	s.print(&out)
	require.Contains(t, out.String(), "duplicates skipped (sluice.inbox.duplicates)  3")
	require.Contains(t, out.String(), "NOT durable", "make run says the embedded tiers are not durable")
	require.Regexp(t, `outbox: relayed \(sluice.outbox.relayed\) +1  `, out.String())
	require.Regexp(t, `outbox: rows left in the table +0 +sluice_outbox\n`, out.String())
	require.Regexp(t, `\n  rows \(order_log table\) +7 +evt-1 evt-2 evt-3 evt-4 evt-5 evt-7 evt-8: each event once\n`, out.String())
	require.Regexp(t, `\n  batches committed \(sluice.inbox.batch.size\) +[1-7] +7 events in all\n`, out.String())
	require.NotRegexp(t, ` \n`, out.String(), "no line ends in padding")

	rec := httptest.NewRecorder()
	s.metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	require.Contains(t, body, `sluice_inbox_duplicates_total{`)
	require.Contains(t, body, `messaging_client_consumed_messages_total{`)
	require.Contains(t, body, `sluice_outcome="poisoned"`)
	require.Contains(t, body, `messaging_process_duration_seconds_bucket{`)
	require.Regexp(t, `sluice_outbox_relayed_total\{[^}]*messaging_destination_name="`+rejectedTopic+`"[^}]*sluice_outbox="sluice_outbox"[^}]*\} 1\n`, body)
	require.Contains(t, body, `sluice_outbox_lag_seconds_bucket{`)
	// Second-based buckets (OpenTelemetry's defaults are milliseconds), the
	// handler label the handler's name.
	for _, le := range []string{"0.005", "0.1", "1", "10"} {
		require.Contains(t, body, `le="`+le+`"`)
	}
	require.NotContains(t, body, `le="5000"`)
	require.Contains(t, body, `messaging_consumer_group_name="inventory"`)
	require.Regexp(t, `sluice_inbox_batch_size_count\{[^}]*messaging_consumer_group_name="orderlog"[^}]*messaging_destination_name="order.created.orderlog"`, body)
	require.NotContains(t, body, `sluice_handler=`, "one name per fact: the consumer group is the handler")
	require.Regexp(t, `messaging_client_consumed_messages_total\{[^}]*messaging_destination_name="order.created"[^}]*messaging_operation_name="process"[^}]*messaging_system="gochannel"`, body)
	require.Regexp(t, `sluice_poisoned_total\{error_type="poison",messaging_consumer_group_name="inventory",messaging_destination_name="order.created",messaging_system="gochannel"`, body)
	require.NotEmpty(t, telemetry.Version())
	require.Contains(t, body, `otel_scope_version="`+telemetry.Version()+`"`, "the scope version is the module's, from the build information")

	require.Contains(t, spans.String(), `"Name": "process order.created"`, "spans printed with --trace-stdout")
	require.Contains(t, spans.String(), `"Name": "send order.created"`)
	require.Contains(t, spans.String(), `"Name": "process order.created.orderlog"`)
	require.Contains(t, spans.String(), `"Name": "sluice.batch"`, "the order log's batches")
}

func TestExampleServers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := testenv.Name("example")
	db := testenv.Postgres(t)
	t.Cleanup(func() { _, _ = db.Exec("DROP SCHEMA IF EXISTS " + name + " CASCADE") })
	testenv.DeleteQueuesAtEnd(t, exampleQueues(name)...)

	s, err := run(ctx, config{AMQPURL: testenv.AMQPURL, PostgresURL: testenv.PostgresURL, Name: name})
	require.NoError(t, err)
	check(t, s)

	// The rejection event went through the outbox table in the inbox
	// transaction (check: relayed 1), and the relay deleted it once
	// RabbitMQ confirmed it.
	require.Equal(t, name+".sluice_outbox", s.OutboxTable)
	var outboxed int
	require.NoError(t, db.Get(&outboxed, `SELECT count(*) FROM `+name+`.sluice_outbox`))
	require.Zero(t, outboxed)
	got := testenv.Drain(t, testenv.AMQP(t), name+"."+rejectedTopic)
	require.Len(t, got, 1, "the rejection event reached its queue once")
	require.Equal(t, "rejected:evt-4", got[0].Headers[sluice.EventIDKey], "the event id given at write time")
	// One publish per event, to the exchange: RabbitMQ routed it to both
	// handlers' queues; the order log's rows are in the example's schema.
	var logged []string
	require.NoError(t, db.Select(&logged, `SELECT event_id FROM `+name+`.order_log ORDER BY event_id`))
	require.Equal(t, s.Logged, logged)
	// Running again drops nothing unasked; with Reset it starts from empty
	// queues and tables.
	_, err = run(ctx, config{AMQPURL: testenv.AMQPURL, PostgresURL: testenv.PostgresURL, Name: name})
	require.ErrorIs(t, err, ErrExists)
	require.NoError(t, db.Get(&outboxed, `SELECT count(*) FROM `+name+`.sluice_outbox`), "the schema is still there")
	s, err = run(ctx, config{AMQPURL: testenv.AMQPURL, PostgresURL: testenv.PostgresURL, Name: name, Reset: true})
	require.NoError(t, err)
	check(t, s)
	require.False(t, strings.Contains(name, "-"))
}

// The servers mode opens its pool as the README tells users to, with
// sluicesql/postgres.Open: a pool whose every wait is bounded, which
// service.New does not warn of (it did: the example's sqlx.Connect pool
// "may not recover from a network fault", a line its NopLogger hid), and
// which keeps the connections the deliveries in flight opened.
func TestExampleServersOpensItsPoolAsTheREADMESays(t *testing.T) {
	t.Parallel()
	name := testenv.Name("example")
	t.Cleanup(func() { _, _ = testenv.Postgres(t).Exec("DROP SCHEMA IF EXISTS " + name + " CASCADE") })
	testenv.DeleteQueuesAtEnd(t, exampleQueues(name)...)
	e, err := newServersEnv(t.Context(), testenv.AMQPURL, testenv.PostgresURL, name, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.close() })
	_, bounded := e.db().Driver().(interface{ BoundsEveryWait() }) // what service.New asks of a lib/pq pool
	require.True(t, bounded, "the example's pool is postgres.Open's, not %T", e.db().Driver())
}

// A server that cannot be reached is an error, printed — never a panic, and
// never the password.
func TestExampleConnectionErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, cfg := range []config{
		{AMQPURL: "amqp://guest:Hidden1@127.0.0.1:1/", PostgresURL: testenv.PostgresURL, Name: testenv.Name("example")},
		{AMQPURL: testenv.AMQPURL, PostgresURL: "postgres://u:Hidden1@127.0.0.1:1/x?sslmode=disable&connect_timeout=2"},
		{AMQPURL: "amqp://guest:Hid%zzden1@127.0.0.1/", PostgresURL: testenv.PostgresURL, Name: testenv.Name("example")},
		{AMQPURL: testenv.AMQPURL},
	} {
		_, err := run(ctx, cfg)
		require.Error(t, err)
		require.NotContains(t, err.Error(), "Hidden1")
		require.NotContains(t, err.Error(), "Hid")
	}
}
