package bench

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The batchhandler suite runs end to end with a tiny N on the test services
// (go run ./cmd/sluice-bench -suite batchhandler -messages 5 -rounds 1), so
// that a change that breaks it fails here rather than in the next run. Its
// bounds' sections are printed measured or not: with so few deliveries a
// run may end within one of /proc/stat's 10 ms ticks, and the CPU bound had
// no rows — the section was left out, and the test failed by timing (once,
// on an idle machine, in a fresh-clone run at e118f86).
func TestBatchHandlerSuiteRuns(t *testing.T) {
	t.Parallel()
	o := Options{PostgresURL: testenv.PostgresURL, AMQPURL: testenv.AMQPURL, Messages: 5, Rounds: 1}
	var out bytes.Buffer
	o.Out = &out
	require.NoError(t, BatchHandlers(t.Context(), o))
	for _, want := range []string{"B1: batch handlers", "batch handler, MaxBatch prefetch/2 (32)", "10% poison", "B1's ceiling", "batches of 64", "÷ no-op consume", "CPU µs/msg", "B1's CPU bound", "B1's bound in turns"} {
		require.Contains(t, out.String(), want)
	}
}

// A bound with no rows says so under its title. Before, the section was
// left out: TestBatchHandlerSuiteRuns failed when its runs were too short
// for a CPU sample.
func TestABoundWithoutRowsSaysItWasNotMeasured(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	bound(&out, "B1's CPU bound: …", []string{"in flight"}, nil, "the note")
	require.Contains(t, out.String(), "B1's CPU bound")
	require.Contains(t, out.String(), "not measured")
	require.NotContains(t, out.String(), "the note")
}

// The ceiling's batch transaction claims as a batch handler does: its claim
// waits a millisecond for a lock, and where another transaction holds one a
// moment longer — a lock on the table, on its extension; no key is shared —
// it claims again waiting longer, as a batch handler claims a held key's
// delivery again alone. Before, the bench failed: once in a make test on
// the loaded machine, "ceiling, 16 in flight: variant 1: message 0: …
// held by another transaction longer than 1ms: pq: canceling statement due
// to lock timeout".
func TestTheCeilingsBatchWaitsOutALockAnotherTransactionHolds(t *testing.T) {
	t.Parallel()
	db, schema, cleanup, err := pgSchema(t.Context(), testenv.PostgresURL, "sluice_bench_lock", 4, nil)
	require.NoError(t, err)
	t.Cleanup(cleanup)
	v, err := newInboxVariants(t.Context(), db, schema)
	require.NoError(t, err)

	locker, err := db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback() }()
	_, err = locker.Exec("LOCK TABLE " + schema + ".inbox IN SHARE MODE") // conflicts with the claim's INSERT
	require.NoError(t, err)

	returned := make(chan error, 1)
	go func() { returned <- v.claimedBatchOf("lock-", 4)(t.Context(), 0) }()
	testenv.AwaitLockWait(t, db, schema, 100*time.Millisecond, returned) // the claim names the table quoted
	require.NoError(t, locker.Commit())
	select {
	case err := <-returned:
		require.NoError(t, err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the batch did not end once the lock was released")
	}
	var rows int
	require.NoError(t, db.Get(&rows, "SELECT count(*) FROM "+schema+".reservations"))
	require.Equal(t, 4, rows)
}
