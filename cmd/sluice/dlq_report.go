package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

func newReport(out io.Writer) *cobra.Command {
	var url, table, run string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Each replayed event's outcome, per replay run; exit 1 while any has none yet",
		Long: "Reads the outcome table the consumers' replay stage writes. For each run: counts by outcome,\n" +
			"then every event that did not end processed or duplicate (poisoned again with its new reason,\n" +
			"rejected, still retrying, or sent with no outcome yet), named as inspect and the console name\n" +
			"it, and what a later run made of it (\"→ processed in run R\"). Exit 1 while any event of the\n" +
			"selected runs has no final outcome: the runbook's confirm step.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if url == "" {
				return usageError{errors.New("--outcomes is required (or env SLUICE_OUTCOMES_URL)")}
			}
			store, closeStore, err := openOutcomes(context.Background(), url, table, false)
			if err != nil {
				return err
			}
			defer closeStore()
			rs, all, err := readOutcomes(store, run, storeTimeout)
			if err != nil {
				return err
			}
			if len(rs) == 0 {
				if run != "" { // a mistyped run id must not pass the confirm step
					return fmt.Errorf("no outcome records of run %q in %s (check --run, --outcomes and --outcomes-table)", diag.Printable(run, 128), diag.Printable(table, 128))
				}
				// The confirm step confirms nothing: a wrong --outcomes or
				// --outcomes-table must not pass it either.
				return fmt.Errorf("no replay runs recorded in %s (nothing to confirm: check --outcomes and --outcomes-table)", diag.Printable(table, 128))
			}
			pending := report(out, rs, all, asJSON)
			if pending > 0 {
				return fmt.Errorf("%d replayed events have no final outcome yet", pending)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	outcomeFlags(fl, &url, &table, "to report")
	fl.StringVar(&run, "run", "", "one replay run (default: every run)")
	fl.BoolVar(&asJSON, "json", false, "one JSON object per event")
	return cmd
}

// storeTimeout bounds each of the CLI's own calls to the outcome records
// (a report's reads, an operator's records): a database that does not
// answer fails the command after it. Generous: a report reads every record
// of a run, or of the table.
const storeTimeout = time.Minute

// readOutcomes reads run's records (every run's with run "") and, for a
// run, every record too (what later runs made of its events), each read
// bounded by bound.
func readOutcomes(store ledger.Ledger, run string, bound time.Duration) (rs, all []replay.Record, err error) {
	read := func(run string) (rs []replay.Record, err error) {
		err = bounded.Within(context.Background(), bound, "the outcome records", func(ctx context.Context) error {
			rs, err = store.Outcomes(ctx, run)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("reading the outcomes: %w", diag.RedactError(err))
		}
		return rs, nil
	}
	if rs, err = read(run); err != nil || run == "" || len(rs) == 0 {
		return rs, rs, err
	}
	all, err = read("")
	return rs, all, err
}

// report prints the records rs, each not processed with what a later run
// of all made of its event, and returns how many have no final outcome.
func report(out io.Writer, rs, all []replay.Record, asJSON bool) int {
	pending := 0
	byRun := map[string]map[sluice.Outcome]int{}
	var runs []string
	for _, r := range rs {
		if !ledger.Final(r.Outcome) {
			pending++
		}
		if asJSON {
			_ = writeJSON(out, r)
			continue
		}
		if byRun[r.Run] == nil {
			byRun[r.Run] = map[sluice.Outcome]int{}
			runs = append(runs, r.Run)
		}
		byRun[r.Run][r.Outcome]++
	}
	if asJSON {
		return pending
	}
	for _, run := range runs {
		var parts []string
		for _, o := range []sluice.Outcome{sluice.OutcomeProcessed, sluice.OutcomeDuplicate, sluice.OutcomeRejected, sluice.OutcomePoisoned,
			ledger.OutcomeCompensated, ledger.OutcomeArchived, ledger.OutcomeDiscarded,
			sluice.OutcomeRetried, sluice.OutcomeParked, sluice.OutcomeHeld, sluice.OutcomeFailed, ledger.OutcomeReplayed} {
			if n := byRun[run][o]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, o))
			}
		}
		fmt.Fprintf(out, "run %s: %s\n", diag.Printable(run, 128), strings.Join(parts, ", "))
		for _, r := range rs {
			if r.Run == run && r.Outcome != sluice.OutcomeProcessed && r.Outcome != sluice.OutcomeDuplicate {
				fmt.Fprintf(out, "  %s\t%s\t%s\t%s%s\n", dlq.RecordName(r), diag.Printable(string(r.Outcome), 32), diag.Printable(r.Class, 32),
					diag.Printable(r.Reason, 200), laterOf(r, all))
			}
		}
	}
	return pending
}

// laterOf says what a later run made of r's event (its event id, else its
// item) when a run recorded after r ended it otherwise: "\t→ processed in
// run R at T". A dead letter poisoned again in one run and processed in
// the next is then seen from the first.
func laterOf(r replay.Record, rs []replay.Record) string {
	var later *replay.Record
	for i, o := range rs {
		same := (r.EventID != "" && o.EventID == r.EventID) || o.Item == r.Item
		if o.Run == r.Run || !same || !o.At.After(r.At) || !ledger.Final(o.Outcome) || o.Outcome == r.Outcome {
			continue
		}
		if later == nil || o.At.After(later.At) {
			later = &rs[i]
		}
	}
	if later == nil {
		return ""
	}
	return fmt.Sprintf("\t→ %s in run %s at %s", diag.Printable(string(later.Outcome), 32), diag.Printable(later.Run, 128), later.At.UTC().Format(time.RFC3339))
}
