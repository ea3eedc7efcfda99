// Package replaytest is the conformance suite of ledger.Ledger: the rules
// the closed loop relies on, whatever keeps the records. The SQL store
// (PostgreSQL, SQLite) and the Redis store run it, and so should a store
// written elsewhere:
//
//	func TestMyLedger(t *testing.T) {
//		replaytest.Run(t, func(t *testing.T) ledger.Ledger {
//			return newIsolatedLedger(t) // a fresh table, prefix or database
//		})
//	}
package replaytest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// NewLedger returns a ledger that no other call shares records with,
// cleaned up by t.Cleanup.
type NewLedger func(t *testing.T) ledger.Ledger

// Run runs the conformance suite against the ledgers newLedger returns.
// Each subtest gets its own ledger and runs in parallel with the others.
func Run(t *testing.T, newLedger NewLedger) {
	t.Helper()
	for name, fn := range map[string]func(*testing.T, ledger.Ledger){
		"Rules":                      testRules,
		"Items":                      testItems,
		"ConcurrentRecordsOfOneItem": testConcurrentRecordsOfOneItem,
		"CommittedIsFinal":           testCommittedIsFinal,
		"Runs":                       testRuns,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newLedger(t))
		})
	}
}

func rec(run, item string, o sluice.Outcome) replay.Record {
	return replay.Record{Run: run, Item: item, EventID: item, Outcome: o, At: time.Now().UTC().Truncate(time.Millisecond)}
}

// testRules: the CLI's "replayed" only where nothing is yet; a consumer's
// outcome replaces it; "duplicate" never replaces "processed" or
// "rejected"; an empty event id keeps the one there; the operator's records
// replace any outcome, keeping event id and class; Outcomes orders by run
// and item, and keeps the time.
func testRules(t *testing.T, s ledger.Ledger) {
	ctx := t.Context()
	require.NoError(t, s.Replayed(ctx, []replay.Record{rec("r1", "b", ""), rec("r1", "a", ""), rec("r1", "c", "")}))
	require.NoError(t, s.Record(ctx, rec("r1", "a", sluice.OutcomeProcessed)))
	require.NoError(t, s.Replayed(ctx, []replay.Record{rec("r1", "a", "")}), "a replayed record after the outcome")
	require.NoError(t, s.Record(ctx, rec("r1", "a", sluice.OutcomeDuplicate)), "a second delivery")
	poisoned := rec("r1", "b", sluice.OutcomePoisoned)
	poisoned.Class, poisoned.Reason = "poison", "unknown schema version 3"
	require.NoError(t, s.Record(ctx, poisoned))
	noID := rec("r1", "c", sluice.OutcomeRejected)
	noID.EventID = ""
	require.NoError(t, s.Record(ctx, noID))
	require.NoError(t, s.Record(ctx, rec("r1", "c", sluice.OutcomeDuplicate)))
	compensated := rec("r1", "b", ledger.OutcomeCompensated)
	compensated.EventID, compensated.Class, compensated.Reason, compensated.Handler = "", "", "refunded by hand", "operator alice"
	require.NoError(t, s.Records(ctx, []replay.Record{compensated}))
	first := rec("r0", "z", sluice.OutcomeProcessed)
	require.NoError(t, s.Record(ctx, first))

	got, err := s.Outcomes(ctx, "")
	require.NoError(t, err)
	var lines []string
	for _, r := range got {
		lines = append(lines, fmt.Sprintf("%s %s %s %s %s %q %s", r.Run, r.Item, r.EventID, r.Outcome, r.Class, r.Reason, r.Handler))
	}
	require.Equal(t, []string{
		`r0 z z processed  "" `,
		`r1 a a processed  "" `,
		`r1 b b compensated poison "refunded by hand" operator alice`,
		`r1 c c rejected  "" `,
	}, lines)
	one, err := s.Outcomes(ctx, "r0")
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.True(t, first.At.Equal(one[0].At), "the time survives: %s, %s", first.At, one[0].At)
}

// testCommittedIsFinal: once an item is processed or rejected, no later
// record of the stage replaces it — a redelivery of the processed event
// (its ack lost) that fails before its claim and is retried, held, parked,
// failed or poisoned is not what became of the item — and a duplicate is
// replaced only by processed or rejected. The operator's records still
// replace any outcome.
func testCommittedIsFinal(t *testing.T, s ledger.Ledger) {
	ctx := t.Context()
	later := []sluice.Outcome{sluice.OutcomeRetried, sluice.OutcomeHeld, sluice.OutcomeParked, sluice.OutcomeFailed,
		sluice.OutcomePoisoned, sluice.OutcomeDuplicate}
	for _, first := range []sluice.Outcome{sluice.OutcomeProcessed, sluice.OutcomeRejected, sluice.OutcomeDuplicate} {
		item := string(first)
		require.NoError(t, s.Record(ctx, rec("r", item, first)))
		for _, o := range later {
			r := rec("r", item, o)
			r.Class, r.Reason = "exhausted", "deduplication: begin: connection refused"
			require.NoError(t, s.Record(ctx, r))
		}
	}
	require.NoError(t, s.Record(ctx, rec("r", "duplicate", sluice.OutcomeProcessed)), "a duplicate first, then the delivery that processed it")
	discarded := rec("r", "rejected", ledger.OutcomeDiscarded)
	require.NoError(t, s.Records(ctx, []replay.Record{discarded}))

	got, err := s.Outcomes(ctx, "r")
	require.NoError(t, err)
	outcomes := map[string]sluice.Outcome{}
	for _, r := range got {
		outcomes[r.Item] = r.Outcome
		if r.Item == "processed" {
			require.Empty(t, r.Reason, "the later failure's reason is not kept")
		}
	}
	require.Equal(t, map[string]sluice.Outcome{
		"processed": sluice.OutcomeProcessed,
		"rejected":  ledger.OutcomeDiscarded,
		"duplicate": sluice.OutcomeProcessed,
	}, outcomes)
}

// testItems: 2,100 items of run r sent, one of another run; Items of every
// other one up to 2,000 (1,001, past the 500 one query names), one
// processed, and 5 unknown, gives those 1,001 and nothing of the other run.
func testItems(t *testing.T, s ledger.Ledger) {
	var sent []replay.Record
	for i := range 2100 {
		sent = append(sent, rec("r", fmt.Sprintf("i%04d", i), ""))
	}
	require.NoError(t, s.Replayed(t.Context(), append(sent, rec("other", "i0000", ""))))
	require.NoError(t, s.Record(t.Context(), rec("r", "i0007", sluice.OutcomeProcessed)))
	var ask []string
	for i := 0; i <= 2000; i += 2 {
		ask = append(ask, fmt.Sprintf("i%04d", i))
	}
	ask = append(ask, "i0007", "none-1", "none-2", "none-3", "none-4", "none-5")
	rs, err := s.Items(t.Context(), "r", ask)
	require.NoError(t, err)
	require.Len(t, rs, 1001+1)
	items := map[string]bool{}
	for _, r := range rs {
		require.Equal(t, "r", r.Run)
		items[r.Item] = true
	}
	require.True(t, items["i0000"] && items["i2000"] && items["i0007"], "the first, the last, the odd one")
	final, _ := replayledger.Count(rs, items)
	require.Equal(t, 1, final, "i0007 processed, the rest replayed")
	none, err := s.Items(t.Context(), "r", nil)
	require.NoError(t, err)
	require.Empty(t, none)
}

// testConcurrentRecordsOfOneItem: consumers record one item at once —
// processed by one, duplicate by seven, in any order: it ends processed,
// every time.
func testConcurrentRecordsOfOneItem(t *testing.T, s ledger.Ledger) {
	for i := range 30 {
		run := fmt.Sprint("run", i)
		var wg sync.WaitGroup
		for j := range 8 {
			o := sluice.OutcomeDuplicate
			if j == 3 {
				o = sluice.OutcomeProcessed
			}
			wg.Go(func() { require.NoError(t, s.Record(t.Context(), rec(run, "e", o))) })
		}
		wg.Wait()
		got, err := s.Outcomes(t.Context(), run)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, sluice.OutcomeProcessed, got[0].Outcome, "run %d", i)
	}
}

// testRuns: a ledger that keeps runs (ledger.Runs) saves, replaces and
// returns each by id, and the recent ones newest first; an unknown id is no
// run. A ledger that does not keep runs skips it.
func testRuns(t *testing.T, s ledger.Ledger) {
	runs, ok := s.(ledger.Runs)
	if !ok {
		t.Skip("the ledger keeps no runs (ledger.Runs)")
	}
	ctx := t.Context()
	at := time.Now().UTC().Truncate(time.Millisecond)
	for i, id := range []string{"run-a", "run-b", "run-c"} {
		require.NoError(t, runs.SaveRun(ctx, ledger.Run{ID: id, Kind: "replay", Queue: "orders.poison", Operator: "alice", Source: "cli",
			Started: at.Add(time.Duration(i) * time.Second), Batches: []byte(`[{"step":1}]`)}))
	}
	done := ledger.Run{ID: "run-b", Kind: "replay", Queue: "orders.poison", Operator: "alice", Source: "cli", Started: at.Add(time.Second),
		Ended: at.Add(2 * time.Second), Stopped: true, Err: "stopped: 1 of 1 canary events were not processed", Count: 3, Moved: 1,
		Batches: []byte(`[{"step":1,"stopped":"re-poisoned"}]`)}
	require.NoError(t, runs.SaveRun(ctx, done), "a run saved again as it ends")
	got, ok, err := runs.Run(ctx, "run-b")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, done.Err, got.Err)
	require.True(t, got.Stopped)
	require.Equal(t, 3, got.Count)
	require.True(t, done.Ended.Equal(got.Ended))
	require.JSONEq(t, string(done.Batches), string(got.Batches))
	_, ok, err = runs.Run(ctx, "run-nope")
	require.NoError(t, err)
	require.False(t, ok)
	recent, err := runs.RecentRuns(ctx, 2)
	require.NoError(t, err)
	require.Len(t, recent, 2)
	require.Equal(t, []string{"run-c", "run-b"}, []string{recent[0].ID, recent[1].ID}, "newest first")
}
