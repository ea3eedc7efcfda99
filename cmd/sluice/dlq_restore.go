package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
)

func newRestore(g *globals, out io.Writer) *cobra.Command {
	var from, fromTable, dbURL, to, keyFile string
	var eventIDs []string
	var limit int
	var dryRun, undigested bool
	cmd := &cobra.Command{
		Use:   "restore",
		Short: "Publish archived messages back to their poison queue (or --to), from a file or a table",
		Long: "Each record written by 'dlq archive' is published, confirmed, with its payload, headers\n" +
			"and the producer's properties as they were, to the poison queue it was archived from\n" +
			"(only a poison queue of the record's own family; --to names any other). Every record is\n" +
			"checked first — it reads, its digest matches, with --signing-key-file its signature\n" +
			"verifies, its queue is its family's — and one that fails publishes nothing.\n" +
			"From a file (--from), running it twice publishes twice. From a table (--from-table, with\n" +
			"--db), each row restored is marked (restored_at, restored_by) after its publish is\n" +
			"confirmed, and a rerun takes only the rows not yet restored. The audit log records each run.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := fileOrTable("--from", from, "--from-table", fromTable, dbURL); err != nil {
				return err
			}
			if limit < 0 {
				return usageError{fmt.Errorf("--limit %d: want 0 (all) or more", limit)}
			}
			signer, err := signerFlag(keyFile)
			if err != nil {
				return err
			}
			if err := g.checkWrite(); err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
			defer cancel()
			src, closeSrc, err := openArchive(ctx, from, func(path string) (dlq.RestoreSource, error) { return dlq.OpenFileSource(path) },
				dbURL, func(db *sqlx.DB) (dlq.RestoreSource, error) {
					return dlq.OpenTableSource(ctx, db, fromTable, g.operator, eventIDs)
				})
			if err != nil {
				return err
			}
			defer closeSrc()
			pub, err := newPublisher(g)
			if err != nil {
				return err
			}
			defer func() { _ = pub.Close() }()
			res, runErr := dlq.Restore(ctx, dlq.Config{Operator: g.operator, Publisher: pub, Signer: signer},
				dlq.RestoreConfig{Source: src, To: to, EventIDs: eventIDs, Limit: limit, DryRun: dryRun, AcceptUndigested: undigested})
			runErr = flagHints(runErr)
			summary(out, "restore", src.Name(), res, dryRun)
			opts := map[string]string{"from": from, "from_table": fromTable, "to": to, "limit": strconv.Itoa(limit), "event_ids": strings.Join(eventIDs, ",")}
			return errorsJoin(runErr, audit(g, "dlq restore", to, dlq.Filter{}, opts, res, dryRun, runErr))
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the archive file")
	cmd.Flags().StringVar(&fromTable, "from-table", "", "the archive table (written by archive --to-table), instead of a file")
	cmd.Flags().StringVar(&dbURL, "db", localenv.Get("SLUICE_ARCHIVE_DB_URL", ""), "PostgreSQL URL of --from-table (env SLUICE_ARCHIVE_DB_URL)")
	cmd.Flags().StringSliceVar(&eventIDs, "event-id", nil, "only the records of these events (repeatable, or comma-separated)")
	cmd.Flags().IntVar(&limit, "limit", 0, "restore at most this many records (0: all selected)")
	cmd.Flags().StringVar(&to, "to", "", "publish every record to this queue instead of the one it was archived from")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "read, count and list each record's target; publish nothing, mark nothing")
	cmd.Flags().StringVar(&keyFile, "signing-key-file", localenv.Get("SLUICE_SIGNING_KEY_FILE", ""),
		"refuse a record not signed with this key (archive --signing-key-file). Default env SLUICE_SIGNING_KEY_FILE")
	cmd.Flags().BoolVar(&undigested, "accept-undigested", false, "restore records without a digest (archives written before records had one)")
	return cmd
}
