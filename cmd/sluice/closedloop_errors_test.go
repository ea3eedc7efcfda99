package main

import (
	"errors"
	"fmt"
	"regexp"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
)

// A consumer with the whole stack but no replay stage (what the README's
// snippets built before) processes the canary and records nothing: the
// closed loop says what is missing and where it looked, instead of "2 of
// the 2 canary events were not processed" (before).
func TestClosedLoopWithoutTheReplayStageSaysWhatIsMissing(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	for i := range 2 {
		b.poisoned(t, fmt.Sprintf("e-%d", i), "stock.reserved", sluice.NewFailure(sluice.ClassExhausted, errors.New("timeout")))
	}
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	consume(t, b, func(*message.Message) error { return nil }, nil, testenv.SQLStore(t, db, schema+".inbox"))
	table := schema + ".sluice_replay"
	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "2",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", table, "--wait", "2s")
	require.Equal(t, 1, code, out+errOut)
	want := "no outcome recorded within --wait 2s for any of the 2 events: does the consumer run the replay stage (router.Stages.Replay) recording into table " + table + " of --outcomes?"
	require.Contains(t, out, "stopped: "+want)
	require.Contains(t, errOut, want)
	require.Contains(t, errOut, "(a service.New with Config.Schema S records into --outcomes-table S.sluice_replay)")
	require.NotContains(t, out, "were not processed")
}

// report is the read-only confirm step: a wrong --outcomes-table is an
// error naming the table, and creates nothing (before: it created the table
// and said "no replay runs recorded", exit 0); a table with no runs confirms
// nothing and exits 1 (before: 0).
func TestReportIsReadOnlyAndConfirmsNothingEmpty(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	wrong := schema + ".sluice_replya"
	code, out, errOut := b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", wrong)
	require.Equal(t, 1, code, out+errOut)
	require.Contains(t, errOut, "no outcome table "+wrong+" in that database (check --outcomes-table and --outcomes")
	var exists bool
	require.NoError(t, db.Get(&exists, `SELECT to_regclass($1) IS NOT NULL`, wrong))
	require.False(t, exists, "report created the table")

	code, _, errOut = b.cli(t, "dlq", "resolve", "--outcomes", testenv.PostgresURL, "--outcomes-table", wrong,
		"--run", "run-x", "--event", "e-1", "--reason", "fixed by hand")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no outcome table "+wrong)
	require.NoError(t, db.Get(&exists, `SELECT to_regclass($1) IS NOT NULL`, wrong))
	require.False(t, exists, "resolve created the table")

	empty := schema + ".sluice_replay"
	testenv.OutcomeStore(t, db, empty)
	code, out, errOut = b.cli(t, "dlq", "report", "--outcomes", testenv.PostgresURL, "--outcomes-table", empty)
	require.Equal(t, 1, code, out+errOut)
	require.Contains(t, errOut, "no replay runs recorded in "+empty+" (nothing to confirm")
}

// The summary's "scanned" counts the messages read, once each, though every
// batch of the closed loop reads the queue again (before: the sum over the
// batches, 11 or more for these 5).
func TestClosedLoopSummaryScansEachMessageOnce(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.exhausted(t, "s", 5)
	rc := newRecovering(t, b, func(string) bool { return false })
	code, out, errOut := b.cli(t, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "1", "--ramp", "1",
		"--outcomes", testenv.PostgresURL, "--outcomes-table", rc.outcomesTable, "--wait", outcomeWait)
	require.Equal(t, 0, code, out+errOut)
	require.Regexp(t, regexp.MustCompile(`scanned\s+│ 5 │`), out)
	require.Regexp(t, regexp.MustCompile(`done\s+│ 5 │`), out)
}
