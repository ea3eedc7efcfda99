package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/service"
)

// dropSchemaNowAndAtEnd drops schema, with everything in it, now and when
// t ends.
func dropSchemaNowAndAtEnd(t *testing.T, db *sqlx.DB, schema string) {
	t.Helper()
	drop := func() {
		_, err := db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		require.NoError(t, err)
	}
	drop()
	t.Cleanup(drop)
}

// get serves path from h and returns the status and the body.
func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, err := io.ReadAll(rec.Body)
	require.NoError(t, err)
	return rec.Code, string(body)
}

// The README's short path runs as written (newInventory) on RabbitMQ and
// PostgreSQL: an order is reserved once however often it is delivered, its
// event is published to inventory.reserved through the outbox, a malformed
// one is isolated in inventory.poison; /readyz passes while it runs,
// /metrics serves Sluice's counters, and Close leaves the outbox empty.
func TestTheREADMEServiceRuns(t *testing.T) {
	t.Parallel()
	db := testenv.PostgresInSchema(t)
	_, err := db.ExecContext(t.Context(), `CREATE TABLE reservations (order_id TEXT NOT NULL)`)
	require.NoError(t, err)
	testenv.DeleteQueuesNowAndAtEnd(t, "inventory", "inventory.retry.30s", "inventory.retry.5m", "inventory.retry.30m", "inventory.poison", "inventory.reserved")
	dropSchemaNowAndAtEnd(t, db, "inventory") // the README's: fixed, as its queues' names are
	conn := testenv.AMQP(t)
	_, err = testenv.Channel(t, conn).QueueDeclare("inventory.reserved", true, false, false, false, nil)
	require.NoError(t, err)

	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	mux := http.NewServeMux()
	svc, q, err := newInventory(t.Context(), r, testenv.AMQPURL, db, mux)
	require.NoError(t, err)
	code, body := get(t, mux, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready before the router runs: %s", body)
	done := testenv.RunRouter(context.Background(), r)
	closed := false
	closeAll := func() {
		if !closed {
			closed = true
			require.NoError(t, svc.Close()) // the router closed, the outbox drained
			require.NoError(t, <-done)
			require.NoError(t, q.Close())
		}
	}
	t.Cleanup(closeAll)

	for _, payload := range []string{
		`{"eventId":"evt-1","orderId":"o-1"}`,
		`{"eventId":"evt-1","orderId":"o-1"}`, // the same event again
		`{"eventId":"evt-2","orderId":`,       // malformed: poisoned by KeyFromJSON, the handler not run
		`{"eventId":"evt-3","orderId":"o-3"}`,
		`{"eventId":"evt-4","orderId":5}`, // JSON of another shape: poisoned by the handler's json.Unmarshal
	} {
		require.NoError(t, q.Publisher().Publish("inventory", message.NewMessage(watermill.NewUUID(), []byte(payload))))
	}
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, "inventory.poison") == 2 },
		2*time.Minute, 20*time.Millisecond, "the malformed order and the one of another shape are isolated in inventory.poison")
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, "inventory.reserved") == 2 },
		2*time.Minute, 20*time.Millisecond, "each reservation's event published once, through the outbox")
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, "inventory") == 0 }, 2*time.Minute, 20*time.Millisecond)

	code, body = get(t, mux, "/readyz")
	require.Equal(t, http.StatusOK, code, body)
	var ready service.Report
	require.NoError(t, json.Unmarshal([]byte(body), &ready))
	require.Equal(t, "pass", ready.Status)
	require.Equal(t, "released", ready.Checks["handler:inventory"].Brake)
	require.True(t, *ready.Checks["outbox"].Running)
	code, body = get(t, mux, "/livez")
	require.Equal(t, http.StatusOK, code, body)

	// The main queue's ready count is 0 while its last delivery (the
	// duplicate, say) may still be in its handler: wait for the counters.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, metrics := get(t, mux, "/metrics")
		assert.Regexp(c, `sluice_inbox_duplicates_total\{[^}]*messaging_consumer_group_name="inventory"[^}]*\} 1\n`, metrics)
		assert.Regexp(c, `sluice_poisoned_total\{[^}]*\} 2\n`, metrics)
		assert.Regexp(c, `sluice_outbox_relayed_total\{[^}]*messaging_destination_name="inventory.reserved"[^}]*\} 2\n`, metrics)
	}, 2*time.Minute, 20*time.Millisecond)

	closeAll() // every delivery handed out is settled: the duplicate's too
	var orders []string
	require.NoError(t, db.SelectContext(t.Context(), &orders, `SELECT order_id FROM reservations ORDER BY order_id`))
	require.Equal(t, []string{"o-1", "o-3"}, orders, "each order reserved once")
	var claims, outboxed int
	require.NoError(t, db.GetContext(t.Context(), &claims, `SELECT count(*) FROM inventory.sluice_inbox`))
	require.Equal(t, 2, claims, "one claim per event processed")
	require.NoError(t, db.GetContext(t.Context(), &outboxed, `SELECT count(*) FROM inventory.sluice_outbox`))
	require.Zero(t, outboxed)
	reserved := testenv.Drain(t, conn, "inventory.reserved")
	require.Len(t, reserved, 2)
	poisoned := testenv.Drain(t, conn, "inventory.poison")
	require.Len(t, poisoned, 2)
	reasons := map[string]string{}
	for _, p := range poisoned {
		require.Equal(t, "poison", p.Headers["sluice_poison_class"])
		reasons[string(p.Body)] = p.Headers["sluice_poison_reason"].(string)
	}
	// The README says where each is isolated: the malformed one by the
	// key function, before the handler; the other by the handler.
	require.Contains(t, reasons[`{"eventId":"evt-2","orderId":`], `deduplication key: JSON field "eventId": payload`)
	require.Contains(t, reasons[`{"eventId":"evt-4","orderId":5}`], "json: cannot unmarshal number")
}

// The README's batch handler runs as written (addLedger) on RabbitMQ and
// PostgreSQL: 50 events each delivered twice and one that breaks the
// ledger's CHECK constraint, in batches: each event's row once, the one
// that breaks it alone in ledger.poison.
func TestTheREADMEBatchHandlerRuns(t *testing.T) {
	t.Parallel()
	db := testenv.PostgresInSchema(t)
	_, err := db.ExecContext(t.Context(), `CREATE TABLE ledger (entry JSONB NOT NULL CHECK (entry->>'amount' <> '-1'))`)
	require.NoError(t, err)
	testenv.DeleteQueuesNowAndAtEnd(t, "ledger", "ledger.retry.30s", "ledger.retry.5m", "ledger.retry.30m", "ledger.poison")
	schema := testenv.Name("ledger_svc")
	dropSchemaNowAndAtEnd(t, db, schema)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	svc, err := service.New(service.Config{DB: db, Schema: schema, Router: r})
	require.NoError(t, err)
	require.NoError(t, svc.Stores().Migrate(t.Context()))
	q, err := addLedger(t.Context(), svc, testenv.AMQPURL)
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)

	for i := range 50 {
		for range 2 {
			payload := fmt.Sprintf(`{"eventId":"evt-%d","amount":%d}`, i, i)
			require.NoError(t, q.Publisher().Publish("ledger", message.NewMessage(watermill.NewUUID(), []byte(payload))))
		}
	}
	require.NoError(t, q.Publisher().Publish("ledger", message.NewMessage(watermill.NewUUID(), []byte(`{"eventId":"evt-bad","amount":-1}`))))
	conn := testenv.AMQP(t)
	count := func() int {
		var n int
		require.NoError(t, db.GetContext(t.Context(), &n, `SELECT count(*) FROM ledger`))
		return n
	}
	// 101 deliveries: the rows waited for while they come, then the
	// duplicates consumed and the bad one isolated.
	if err := testenv.AwaitCount(50, time.Minute, 10*time.Minute, count); err != nil {
		t.Fatalf("each event's row: %v; %s", err, testenv.QueueDepths(t, conn, "ledger", "ledger.poison"))
	}
	require.NoError(t, testenv.AwaitDrained(time.Minute, 10*time.Minute, func() int { return testenv.QueueDepth(t, conn, "ledger") }), "the duplicates consumed")
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, "ledger.poison") == 1 }, time.Minute, 20*time.Millisecond, "the bad one isolated")
	require.NoError(t, svc.Close())
	require.NoError(t, <-done)
	require.NoError(t, q.Close())
	var distinct int
	require.NoError(t, db.GetContext(t.Context(), &distinct, `SELECT count(DISTINCT entry->>'eventId') FROM ledger`))
	require.Equal(t, 50, distinct)
	require.Equal(t, 50, count(), "each event's row once")
	poisoned := testenv.Drain(t, conn, "ledger.poison")
	require.Len(t, poisoned, 1)
	require.Equal(t, `{"eventId":"evt-bad","amount":-1}`, string(poisoned[0].Body))
	require.Contains(t, poisoned[0].Headers["sluice_poison_reason"], "ledger_entry_check")
}
