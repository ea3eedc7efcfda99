package main

import (
	"context"
	"errors"
	"io"
	"strconv"

	"github.com/jmoiron/sqlx"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/replay/ledger"
)

func newArchive(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var file, tableName, dbURL, keyFile string
	recs := &operatorRecords{g: g, create: true}
	cmd := &cobra.Command{
		Use:   "archive",
		Short: "Write selected messages to a JSON-lines file or a database table, then remove them from the poison queue",
		Long: "Each selected message (payload, metadata, diagnosis) is appended to the file and synced\n" +
			"to disk (--to), or inserted into the table (--to-table, with --db), before it is acked.\n" +
			"Each record carries the poison queue it came from and a SHA-256 digest of its contents,\n" +
			"and with --signing-key-file an HMAC under that key, which restore checks.\n" +
			"Messages not selected stay, in order. The file or table is opened before anything moves.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := fileOrTable("--to", file, "--to-table", tableName, dbURL); err != nil {
				return err
			}
			if err := checkOutcomesURL(recs.url); err != nil {
				return err
			}
			signer, err := signerFlag(keyFile)
			if err != nil {
				return err
			}
			f, conn, ctx, done, err := ff.open(g, true)
			if err != nil {
				return err
			}
			defer done()
			opts := map[string]string{"to": file, "to_table": tableName, "limit": strconv.Itoa(ff.limit)}
			sink, closeSink, err := openArchive(ctx, file, func(path string) (dlq.ArchiveSink, error) { return dlq.OpenFileSink(path) },
				dbURL, func(db *sqlx.DB) (dlq.ArchiveSink, error) { return dlq.NewTableSink(ctx, db, tableName) })
			if err != nil { // nothing moved; the attempt is audited
				return errorsJoin(err, audit(g, "dlq archive", ff.queue, f, opts, dlq.Result{}, false, err))
			}
			defer closeSink()
			res, runErr := dlq.Open(conn, ff.queue, dlq.Config{Operator: g.operator, Signer: signer}).Archive(ctx, dlq.ArchiveConfig{Filter: f, Limit: ff.limit, Sink: sink,
				Archived: func(m *dlq.Message) {
					recs.add(ledger.OutcomeArchived, m.Item(), m.EventID, m.Class, "archived to "+sink.Name())
				}})
			summary(out, "archive", ff.queue, res, false)
			run, recErr := recs.flush(context.Background(), newRun("archive"))
			printRun(out, run)
			opts["run"] = run
			return errorsJoin(errors.Join(runErr, recErr), audit(g, "dlq archive", ff.queue, f, opts, res, false, errors.Join(runErr, recErr)))
		},
	}
	ff.register(cmd, "archive at most this many messages (0: all selected)")
	cmd.Flags().StringVar(&file, "to", "", "the archive file, JSON lines, appended to")
	cmd.Flags().StringVar(&tableName, "to-table", "", "the archive table (name or schema.name; created if missing), instead of a file")
	cmd.Flags().StringVar(&dbURL, "db", localenv.Get("SLUICE_ARCHIVE_DB_URL", ""), "PostgreSQL URL of --to-table (env SLUICE_ARCHIVE_DB_URL)")
	recs.register(cmd, "record each archived event as \"archived\" in the outcome table")
	cmd.Flags().StringVar(&keyFile, "signing-key-file", localenv.Get("SLUICE_SIGNING_KEY_FILE", ""),
		"sign each record with this key (signing.NewFromFile), for restore --signing-key-file to check. Default env SLUICE_SIGNING_KEY_FILE")
	return cmd
}
