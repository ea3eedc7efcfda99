package main

import (
	"context"
	"testing"
	"time"

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
	store, done, err := openOutcomes(dsn, schema+".outcomes", true)
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
	_, done, err := openOutcomes(dsn, table, true)
	require.NoError(t, err)
	t.Cleanup(done)

	proxy.BlackHole()
	const bound = 15 * time.Second
	took := testenv.Within(t, bound+25*time.Second, "openOutcomes", func() {
		var done func()
		if _, done, err = openOutcomes(dsn, table, false); done != nil {
			done()
		}
	})
	require.Less(t, took, bound, "openOutcomes")
	require.Error(t, err)
	require.ErrorContains(t, err, "--outcomes: connecting to the database (within its connect_timeout, default 5s)")
	t.Logf("openOutcomes on the silent database: %v", err)
}
