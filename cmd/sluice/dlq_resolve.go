package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/replay/ledger"
)

func newResolve(g *globals, out io.Writer) *cobra.Command {
	var run, reason string
	var events []string
	recs := &operatorRecords{g: g}
	cmd := &cobra.Command{
		Use:   "resolve",
		Short: "Record that replayed events were repaired by hand (\"compensated\"), with a reason",
		Long: "For events a replay could not process (poisoned again, rejected) that were then put right\n" +
			"another way: their outcome in the run becomes \"compensated\", with the operator and the\n" +
			"reason, and the audit log records it. The report then shows them as ended.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			switch {
			case recs.url == "":
				return usageError{errors.New("--outcomes is required (or env SLUICE_OUTCOMES_URL)")}
			case run == "" || len(events) == 0:
				return usageError{errors.New("--run and --event are required")}
			case strings.TrimSpace(reason) == "":
				return usageError{errors.New("--reason is required: say how the events were repaired")}
			}
			if err := g.checkWrite(); err != nil {
				return err
			}
			for _, e := range events {
				recs.add(ledger.OutcomeCompensated, e, e, "", reason)
			}
			_, runErr := recs.flush(context.Background(), run)
			if runErr == nil {
				fmt.Fprintf(out, "%d events of run %s recorded compensated\n", len(events), diag.Printable(run, 128))
			}
			rec := auditRecord(g, "dlq resolve", "", dlq.Filter{}, map[string]string{"run": run}, dlq.Result{Replayed: len(events)}, false, runErr)
			rec.Reason, rec.Items = reason, events
			return errorsJoin(runErr, dlq.AppendAudit(g.audit, rec))
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&run, "run", "", "the replay run (required)")
	fl.StringSliceVar(&events, "event", nil, "event ids (repeatable or comma-separated; required)")
	fl.StringVar(&reason, "reason", "", "how they were repaired (required)")
	recs.register(cmd, "the outcome table (required)")
	return cmd
}
