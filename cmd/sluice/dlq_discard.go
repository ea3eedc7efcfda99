package main

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/replay/ledger"
)

func newDiscard(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var reason string
	var dryRun bool
	recs := &operatorRecords{g: g, create: true}
	cmd := &cobra.Command{
		Use:   "discard",
		Short: "Remove selected messages for good, with a reason, recorded in the audit log",
		Long: "For messages that must not be processed and need not be kept (archive them instead to\n" +
			"keep them). The audit line names the operator, the reason, the selection and every\n" +
			"discarded event id. Messages not selected stay, in order.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if strings.TrimSpace(reason) == "" {
				return usageError{errors.New("--reason is required: say why these messages are discarded")}
			}
			if err := checkOutcomesURL(recs.url); err != nil {
				return err
			}
			f, conn, ctx, done, err := ff.open(g, true)
			if err != nil {
				return err
			}
			defer done()
			res, items, runErr := dlq.Open(conn, ff.queue, dlq.Config{}).Discard(ctx, f, ff.limit, dryRun)
			summary(out, "discard", ff.queue, res, dryRun)
			var run string
			if !dryRun {
				for _, it := range items {
					recs.add(ledger.OutcomeDiscarded, it, it, "", reason)
				}
				var recErr error
				run, recErr = recs.flush(context.Background(), newRun("discard"))
				runErr = errors.Join(runErr, recErr)
				printRun(out, run)
			}
			rec := auditRecord(g, "dlq discard", ff.queue, f, map[string]string{"limit": strconv.Itoa(ff.limit), "run": run}, res, dryRun, runErr)
			rec.Reason, rec.Items = reason, items
			return errorsJoin(runErr, dlq.AppendAudit(g.audit, rec))
		},
	}
	ff.register(cmd, "discard at most this many messages (0: all selected)")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required), recorded in the audit log")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "select and count; remove nothing")
	recs.register(cmd, "record each discarded event as \"discarded\", with the reason, in the outcome table")
	return cmd
}
