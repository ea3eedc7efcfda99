package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
)

// Issue 28.5 and 28.14: a row that can never be published (its queue
// missing, here) is tried MaxAttempts times, then set aside as dead with its
// error — tried no more, counted, shown by list --dead with the broker's
// reason whole, its stored error redacted on read; an operator requeues
// it (audited) once the cause is fixed, or discards it (audited). Before, it
// was retried every RetryMax for ever and the CLI could do nothing with it.
func TestOutboxDeadRowsAreSetAsideListedRequeuedAndDiscarded(t *testing.T) {
	t.Parallel()
	b := newOutboxBed(t)
	missing := testenv.Name("outbox-dead")
	testenv.DeleteQueuesAtEnd(t, missing)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	meter := sdkmetric.NewManualReader()
	cfg := outbox.RelayConfig{PollInterval: 10 * time.Millisecond, RetryMin: 5 * time.Millisecond,
		RetryMax: 10 * time.Millisecond, MaxAttempts: 3, StatsInterval: 10 * time.Millisecond,
		Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(meter))}}
	stopRelay := runRelay(t, b.store, pub, cfg)
	v, exported := metricValue(t, meter, "sluice.outbox.dead_lettered")
	require.True(t, exported, "exported at zero, before any row died")
	require.Zero(t, v)
	b.write(t, missing, "m-1", "m-2")
	require.Eventually(t, func() bool {
		st, err := b.store.Stats(t.Context())
		return err == nil && st.Dead == 2 && st.Pending == 0
	}, 60*time.Second, 10*time.Millisecond, "set aside after 3 attempts")
	// Counted once the batch's Finish returned: after the commit the
	// Stats above may read first.
	require.Eventually(t, func() bool { return testenv.CounterSum(t, meter, "sluice.outbox.dead_lettered") == 2 }, time.Minute, 10*time.Millisecond)
	require.Eventually(t, func() bool { v, _ := metricValue(t, meter, "sluice.outbox.dead"); return v == 2 }, time.Minute, 10*time.Millisecond)
	var attempts []int
	require.NoError(t, b.db.Select(&attempts, `SELECT attempts FROM `+b.table+` ORDER BY id`))
	require.Equal(t, []int{3, 3}, attempts, "tried no more once dead")
	stopRelay()

	// A stored error written before redaction on write (or by hand).
	_, err = b.db.Exec(`UPDATE ` + b.table + ` SET last_error = last_error || ' amqp://relay:Hidden1@broker/' WHERE message_id = 'm-2'`)
	require.NoError(t, err)
	code, out, errOut := b.cli(t, "outbox", "list", "--dead")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "2 dead rows shown, oldest first; "+b.table+" holds 0 pending, 0 failing, 2 dead")
	require.Regexp(t, `│ +3 │ +\d+s │ dead \d+s ago`, out)
	require.Contains(t, strings.Join(strings.Fields(strings.NewReplacer("│", " ").Replace(out)), " "), "NO_ROUTE", "the broker's reason, not cut")
	require.NotContains(t, out, "Hidden1")
	code, out, errOut = b.cli(t, "outbox", "list", "--failing")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0 failing rows shown")
	code, out, errOut = b.cli(t, "outbox", "list", "--dead", "--json")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "Hidden1")
	var row outboxRowJSON
	require.NoError(t, json.Unmarshal([]byte(strings.Split(out, "\n")[0]), &row))
	require.NotNil(t, row.DeadAt)
	code, out, errOut = b.cli(t, "outbox", "stats")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, regexp.QuoteMeta(b.table)+` +│ +0 │ +0 │ +2 │ - +│`, out, "a dead row is not the oldest pending one")

	code, _, errOut = b.cli(t, "outbox", "requeue", "--all-dead")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--reason is required")
	code, _, errOut = b.cli(t, "outbox", "discard", "--reason", "x")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--id")

	entries, err := b.store.List(t.Context(), sluicesql.OutboxDead, 10)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	cli := func(args ...string) (int, string, string) {
		var o, e bytes.Buffer
		c := run(append([]string{"--audit", audit, "--operator", "alice"}, append(args, "--db", testenv.PostgresURL, "--table", b.table)...), &o, &e)
		return c, o.String(), e.String()
	}
	code, out, errOut = cli("outbox", "discard", "--id", strconv.FormatInt(entries[1].ID, 10), "--reason", "billing retired this event")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 dead rows of "+b.table+" are deleted")

	conn := testenv.AMQP(t)
	_, err = testenv.Channel(t, conn).QueueDeclare(missing, true, false, false, false, nil)
	require.NoError(t, err)
	code, out, errOut = cli("outbox", "requeue", "--all-dead", "--reason", "queue declared")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 dead rows of "+b.table+" are pending again")
	runRelay(t, b.store, pub, cfg)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, missing) == 1 }, 2*time.Minute, 10*time.Millisecond,
		"the requeued row is published")
	require.Equal(t, "m-1", testenv.Drain(t, conn, missing)[0].Headers["_watermill_message_uuid"])

	lines, err := os.ReadFile(audit)
	require.NoError(t, err)
	log := strings.Split(strings.TrimSpace(string(lines)), "\n")
	require.Len(t, log, 2)
	require.Contains(t, log[0], `"operator":"alice","command":"outbox discard"`)
	require.Contains(t, log[0], `"reason":"billing retired this event"`)
	require.Contains(t, log[0], `"discarded":1`)
	require.Contains(t, log[0], "message m-2")
	require.Contains(t, log[1], `"command":"outbox requeue"`)
	require.Contains(t, log[1], `"requeued":1`)
	require.Contains(t, log[1], "message m-1")
}

// metricValue collects reader and returns the sum of the int64 counter or
// gauge name over its data points, and whether it has any.
func metricValue(t *testing.T, reader *sdkmetric.ManualReader, name string) (int64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	var total int64
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			var points []metricdata.DataPoint[int64]
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				points = d.DataPoints
			case metricdata.Gauge[int64]:
				points = d.DataPoints
			}
			for _, p := range points {
				total, found = total+p.Value, true
			}
		}
	}
	return total, found
}
