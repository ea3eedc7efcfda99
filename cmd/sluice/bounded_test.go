package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// The read of a queue's counts that `sluice queues` and the console's
// start-up make (row), and `dlq replay`'s of its depth (queueDepth), on a
// broker that went silent after the handshake give up after
// callTimeout, row with the error (not the queue shown missing);
// before, they waited for the AMQP heartbeat to give the connection up —
// on a connection without heartbeats, for ever.
func TestABlackHoledBrokerHoldsNoQueueRowPastCallTimeout(t *testing.T) {
	t.Parallel()
	proxy, url := testenv.ProxyAMQP(t)
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: url + "?heartbeat=0"}, "cli black hole")
	require.NoError(t, err)
	t.Cleanup(func() { _ = amqpcall.Close(context.Background(), conn, time.Second) })
	proxy.BlackHole()
	q := testenv.Name("cli_holed")

	testenv.Within(t, callTimeout+25*time.Second, "row", func() { _, err = row(conn, q, q, "main") })
	require.ErrorContains(t, err, "reading queue "+q+": a passive declare of "+q+": the broker gave no answer within "+callTimeout.String(),
		"the error, not a queue shown missing")
	start := time.Now()
	require.Zero(t, queueDepth(conn, q))
	require.Less(t, time.Since(start), callTimeout/2, "the connection was closed under the first: at once, not after another CallTimeout")
}

// `dlq report`'s reads of the outcome records and an operator command's
// records (archive, discard, resolve) on a database that went silent after
// the command opened it fail after their bound, naming the call; before,
// they ran on context.Background() and never returned.
func TestABlackHoledDatabaseHoldsNoReportPastItsBound(t *testing.T) {
	t.Parallel()
	schema := testenv.Schema(t, testenv.Postgres(t))
	proxy, dsn := testenv.ProxyPostgresURL(t)
	store, done, err := openOutcomes(t.Context(), dsn, schema+".outcomes", true)
	require.NoError(t, err)
	t.Cleanup(done)
	_, _, err = readOutcomes(store, "run-1", time.Second)
	require.NoError(t, err)

	proxy.BlackHole()
	const bound = time.Second
	for what, f := range map[string]func() error{
		"the report's read": func() error { _, _, err := readOutcomes(store, "run-1", bound); return err },
		"the records' write": func() error {
			return writeRecords(context.Background(), store, []replay.Record{{Run: "run-1", Item: "e1", EventID: "e1", Outcome: ledger.OutcomeDiscarded}}, bound)
		},
	} {
		took := testenv.Within(t, bound+30*time.Second, what, func() { err = f() })
		require.Less(t, took, bound+10*time.Second, "%s: the bound, and the pool's CancelGrace or connect_timeout", what)
		require.Error(t, err, what)
		t.Logf("%s on the silent database: %v", what, err)
	}
}

// The outcome records on a database that went silent — the connection up,
// nothing coming back — hold no opening past its bound (the pool's
// connect_timeout), and the error names the call; before, the pool
// (lib/pq's alone) waited on the start-up for ever. (Moved with the opening
// from package dlq, whose TestABlackHoledDatabaseHoldsNoOutcomeReadPastCallTimeout
// keeps the wait for the outcomes.)
func TestABlackHoledDatabaseHoldsNoOutcomeOpenPastItsBound(t *testing.T) {
	t.Parallel()
	schema := testenv.Schema(t, testenv.Postgres(t))
	table := schema + ".outcomes"
	proxy, dsn := testenv.ProxyPostgresURL(t)
	_, done, err := openOutcomes(t.Context(), dsn, table, true)
	require.NoError(t, err)
	t.Cleanup(done)

	proxy.BlackHole()
	const bound = connectTimeout + 10*time.Second
	took := testenv.Within(t, bound+25*time.Second, "openOutcomes", func() {
		var done func()
		if _, done, err = openOutcomes(t.Context(), dsn, table, false); done != nil {
			done()
		}
	})
	require.Less(t, took, bound, "openOutcomes")
	require.Error(t, err)
	require.ErrorContains(t, err, "--outcomes: connecting to the database (within its connect_timeout, default 30s)")
	t.Logf("openOutcomes on the silent database: %v", err)
}

// A database that answers a session's start-up late — as one on a starved
// host does, seconds after the TCP connect — is waited for up to the CLI's
// connect bound (30 s), by every command that opens one: the outcome
// records (report), an archive table (restore) and an outbox (stats). The
// commands below reach the database and fail on what they find there (an
// empty outcome table, missing tables), not on the connection. Before, the
// pool gave a start-up 5 s (sluicesql/postgres's default) and the first
// call's own bound (10 s) cut it shorter still: CI failed with
// "connecting to the database (within its connect_timeout, default 5s):
// read tcp …: i/o timeout" at a load average past 20.
func TestADatabaseSlowToStartASessionIsWaitedFor(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	outcomes := schema + ".sluice_replay"
	testenv.OutcomeStore(t, db, outcomes)
	proxy, dsn := testenv.ProxyPostgresURL(t)
	const late = 12 * time.Second // past the old 5 s and 10 s, inside 30 s
	proxy.SlowStart(late)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"report", []string{"dlq", "report", "--outcomes", dsn, "--outcomes-table", outcomes}, "no replay runs recorded in " + outcomes},
		{"restore", []string{"dlq", "restore", "--from-table", schema + ".no_archive", "--db", dsn}, "no_archive"},
		{"outbox stats", []string{"outbox", "stats", "--db", dsn, "--table", schema + ".no_outbox"}, "no outbox table " + schema + ".no_outbox in that database"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut strings.Builder
			var code int
			took := testenv.Within(t, 2*time.Minute, c.name, func() {
				code = run(append([]string{"--amqp-url", testenv.AMQPURL, "--audit", filepath.Join(t.TempDir(), "audit.jsonl")}, c.args...), &out, &errOut)
			})
			require.Equal(t, 1, code, errOut.String())
			require.Contains(t, errOut.String(), c.want)
			require.NotContains(t, errOut.String(), "connecting to the database")
			require.GreaterOrEqual(t, took, late, "the start-up was held")
		})
	}
}

// The wait for a database slow to start a session ends with the command's
// context — Ctrl-C, which dlq archive, restore and replay catch — and says
// so, not that the database stayed silent. Before, the archive table and
// the outcome records were opened on context.Background(): a caught Ctrl-C
// ended nothing for up to 35 s (a deadline stands in for it here).
func TestAnInterruptEndsTheWaitForASlowDatabase(t *testing.T) {
	t.Parallel()
	proxy, dsn := testenv.ProxyPostgresURL(t)
	proxy.SlowStart(time.Minute)
	for what, open := range map[string]func(ctx context.Context) error{
		"the outcome records": func(ctx context.Context) error {
			_, done, err := openOutcomes(ctx, dsn, "sluice_replay", false)
			if done != nil {
				done()
			}
			return err
		},
		"an archive table": func(ctx context.Context) error {
			_, done, err := openArchive(ctx, "", nil, dsn, func(*sqlx.DB) (io.Closer, error) { return io.NopCloser(nil), nil })
			if done != nil {
				done()
			}
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		var err error
		took := testenv.Within(t, 40*time.Second, what, func() { err = open(ctx) })
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, what)
		require.ErrorContains(t, err, "connecting to the database: context deadline exceeded", what)
		require.Less(t, took, 15*time.Second, "%s: ended with its context, not after the 30 s bound", what)
	}
}
