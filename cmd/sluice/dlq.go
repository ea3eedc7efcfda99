package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/rabbitmq"

	"github.com/sluicemq/sluice/signing"
)

// filterFlags are the selection flags of inspect, replay and archive.
type filterFlags struct {
	queue, errorMatch, since, until string
	classes, eventTypes             []string
	limit                           int
	unreadable                      bool
}

func (f *filterFlags) register(cmd *cobra.Command, limitHelp string) {
	fl := cmd.Flags()
	fl.StringVar(&f.queue, "queue", "", "the poison queue (required)")
	fl.StringSliceVar(&f.classes, "class", nil, "only these classes: poison, invariant, exhausted, or broker:<reason> for what RabbitMQ dead-lettered with no Sluice diagnosis (broker:delivery_limit)")
	fl.StringVar(&f.errorMatch, "error-match", "", "only messages whose sluice_poison_reason matches this regular expression")
	fl.StringSliceVar(&f.eventTypes, "event-type", nil, "only these sluice_event_type values")
	fl.StringVar(&f.since, "since", "", "only messages poisoned at or after this time (RFC 3339, or a duration back from now: 24h)")
	fl.StringVar(&f.until, "until", "", "only messages poisoned before this time (RFC 3339, or a duration back from now)")
	fl.IntVar(&f.limit, "limit", 0, limitHelp)
	fl.BoolVar(&f.unreadable, "unreadable", false, "only messages whose headers the AMQP client could not parse (no diagnosis, no event id: named by position and message id)")
}

// brokerClassPrefix starts the class dlq gives a message RabbitMQ
// dead-lettered with no Sluice diagnosis (dlq.Message.Class:
// "broker:delivery_limit").
const brokerClassPrefix = "broker:"

// callTimeout bounds each of the CLI's own waits on the broker (a passive
// declare, a connection's close), as package dlq bounds its own: 10 s
// without progress (amqpcall.Do; the connection is rabbitmq.Dial's).
const callTimeout = 10 * time.Second

func (f *filterFlags) filter() (dlq.Filter, error) {
	var out dlq.Filter
	if f.queue == "" {
		return out, usageError{fmt.Errorf("--queue is required")}
	}
	if f.limit < 0 {
		return out, usageError{fmt.Errorf("--limit must not be negative")}
	}
	for _, c := range f.classes {
		if reason, ok := strings.CutPrefix(c, brokerClassPrefix); ok && reason != "" {
			out.Classes = append(out.Classes, c) // the broker's diagnosis, as stats shows it
			continue
		}
		cl, err := sluice.ParseClass(c)
		if err != nil || cl == sluice.ClassTransient || cl == sluice.ClassRejected {
			return out, usageError{fmt.Errorf("--class %q: want poison, invariant, exhausted or broker:<reason> (broker:delivery_limit)", c)}
		}
		out.Classes = append(out.Classes, cl.String())
	}
	if f.errorMatch != "" {
		re, err := regexp.Compile(f.errorMatch)
		if err != nil {
			return out, usageError{fmt.Errorf("--error-match: %w", err)}
		}
		out.ErrorMatch = re
	}
	out.EventTypes = f.eventTypes
	out.Unreadable = f.unreadable
	var err error
	if out.Since, err = parseTime("--since", f.since); err != nil {
		return out, err
	}
	if out.Until, err = parseTime("--until", f.until); err != nil {
		return out, err
	}
	return out, nil
}

// open parses the filter, connects and returns a context that ends on
// Ctrl-C; done closes what it opened.
// open checks the flags and connects. A command that moves messages
// (moves) checks first that the audit log can be written: after the flags,
// so that a usage error leaves no file behind, and before anything moves.
func (f *filterFlags) open(g *globals, moves bool) (dlq.Filter, *amqp.Connection, context.Context, func(), error) {
	filter, err := f.filter()
	if err != nil {
		return filter, nil, nil, nil, err
	}
	if moves {
		if err := g.checkWrite(); err != nil {
			return filter, nil, nil, nil, err
		}
	}
	conn, err := connect(g)
	if err != nil {
		return filter, nil, nil, nil, err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	return filter, conn, ctx, func() { cancel(); _ = amqpcall.Close(context.Background(), conn, callTimeout) }, nil
}

func parseTime(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, usageError{fmt.Errorf("%s %q: want RFC 3339 (2026-11-30T09:00:00Z) or a duration (24h)", flag, v)}
	}
	return t, nil
}

// newPublisher is the confirmed publisher replay and restore publish with.
func newPublisher(g *globals) (*rabbitmq.Publisher, error) {
	c, err := g.connection()
	if err != nil {
		return nil, err
	}
	return rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: c})
}

func connect(g *globals) (*amqp.Connection, error) {
	c, err := g.connection()
	if err != nil {
		return nil, err
	}
	return rabbitmq.Dial(c, "sluice cli")
}

func newDLQ(g *globals, out io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use: "dlq", Short: "Inspect, replay and archive a poison queue",
		// A mistyped subcommand's flags are not this command's: let cobra
		// name the subcommand and suggest the right one instead.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		Args:               unknownSubcommand,
		RunE:               func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	cmd.AddCommand(newStats(g, out), newInspect(g, out), newReplay(g, out), newArchive(g, out), newDiscard(g, out), newRestore(g, out), newReport(out), newResolve(g, out))
	return cmd
}

// cellMax bounds what a table cell shows of a message's contents, in bytes.
const cellMax = 200

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// signerFlag is the Signer of a --signing-key-file, nil without one.
func signerFlag(keyFile string) (*signing.Signer, error) {
	if keyFile == "" {
		return nil, nil
	}
	signer, err := signing.NewFromFile(keyFile)
	if err != nil {
		return nil, usageError{fmt.Errorf("--signing-key-file: %w", err)}
	}
	return signer, nil
}

// fileOrTable checks an archive's flags: exactly one of a file and a table,
// and the table with its database.
func fileOrTable(fileFlag, file, tableFlag, table, dbURL string) error {
	if (file == "") == (table == "") {
		return usageError{fmt.Errorf("exactly one of %s FILE and %s TABLE is required", fileFlag, tableFlag)}
	}
	if table != "" && dbURL == "" {
		return usageError{fmt.Errorf("%s needs --db (a PostgreSQL URL; env SLUICE_ARCHIVE_DB_URL)", tableFlag)}
	}
	return nil
}

// openArchive opens an archive's file with openFile, or its table on the
// PostgreSQL database at dbURL with openTable; done closes what it opened.
func openArchive[T io.Closer](ctx context.Context, file string, openFile func(string) (T, error), dbURL string, openTable func(*sqlx.DB) (T, error)) (_ T, done func(), _ error) {
	var none T
	if file != "" {
		f, err := openFile(file)
		if err != nil {
			return none, nil, err
		}
		return f, func() { _ = f.Close() }, nil
	}
	db, err := openPostgres(ctx, dbURL)
	if err != nil {
		return none, nil, fmt.Errorf("--db: %w", err)
	}
	t, err := openTable(db)
	if err != nil {
		_ = db.Close()
		return none, nil, diag.RedactError(err)
	}
	return t, func() { _ = t.Close(); _ = db.Close() }, nil
}

// register adds --outcomes and --outcomes-table.
func (o *operatorRecords) register(cmd *cobra.Command, help string) {
	outcomeFlags(cmd.Flags(), &o.url, &o.table, help)
}

// outcomeFlags registers --outcomes and --outcomes-table; what says what
// the records are for.
func outcomeFlags(fl *pflag.FlagSet, url, table *string, what string) {
	fl.StringVar(url, "outcomes", localenv.Get("SLUICE_OUTCOMES_URL", ""),
		"the outcome records "+what+": a PostgreSQL URL (the outcome table), or a redis:// URL (sluiceredis.Outcomes) (env SLUICE_OUTCOMES_URL)")
	fl.StringVar(table, "outcomes-table", "sluice_replay", "the outcome table (name or schema.name); on Redis the key prefix, without its colon")
}

// printRun names the run an operator's records went under.
func printRun(out io.Writer, run string) {
	if run != "" {
		fmt.Fprintf(out, "outcomes recorded as run %s\n", run)
	}
}

func summary(out io.Writer, what, queue string, res dlq.Result, dryRun bool) {
	title := what + " from " + diag.Printable(queue, 255)
	if dryRun {
		title += " (dry run: nothing changed)"
	}
	fmt.Fprintln(out, title)
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetStyle(table.StyleLight)
	t.AppendRows([]table.Row{{"scanned", res.Scanned}, {"selected", res.Selected}, {"done", res.Replayed}})
	targets := make([]string, 0, len(res.ByTarget))
	for k := range res.ByTarget {
		targets = append(targets, k)
	}
	sort.Strings(targets)
	for _, k := range targets {
		t.AppendRow(table.Row{"  to " + diag.Printable(k, cellMax), res.ByTarget[k]})
	}
	t.Render()
	if dryRun && len(res.Plan) > 0 {
		p := table.NewWriter()
		p.SetOutputMirror(out)
		p.SetStyle(table.StyleLight)
		p.AppendHeader(table.Row{"would " + what, "to"})
		for _, m := range res.Plan {
			p.AppendRow(table.Row{m.Message, diag.Printable(m.Target, cellMax)})
		}
		p.Render()
	}
}

func audit(g *globals, command, queue string, f dlq.Filter, opts map[string]string, res dlq.Result, dryRun bool, runErr error) error {
	return dlq.AppendAudit(g.audit, auditRecord(g, command, queue, f, opts, res, dryRun, runErr))
}

func auditRecord(g *globals, command, queue string, f dlq.Filter, opts map[string]string, res dlq.Result, dryRun bool, runErr error) dlq.AuditRecord {
	rec := dlq.AuditRecord{
		Time: time.Now().UTC(), Operator: g.operator, Command: command, Queue: queue,
		Filters: f.Describe(), Options: opts, Result: res, Outcome: "ok",
	}
	if dryRun {
		rec.Outcome = "dry-run"
	}
	if runErr != nil {
		rec.Outcome, rec.Error = "error", diag.Redact(runErr.Error())
	}
	return rec
}

// writeJSON writes v as one line of JSON with every control character of
// message contents escaped: encoding/json leaves the C1 controls and the
// bidirectional overrides raw (diag.EscapeJSON).
func writeJSON(out io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = out.Write(append(diag.EscapeJSON(b), '\n'))
	return err
}

// dlqFlags are the flags that act on an error of package dlq, the first
// that matches; dlq names none (the console, which shows the same errors,
// has no flags).
var dlqFlags = []struct {
	err  error
	hint string
}{
	{dlq.ErrNoTarget, "use --to"},
	{dlq.ErrTargetRefused, "--to redirects every message; --target names the queues a replay may publish to"},
	{dlq.ErrUnreadable, "--unreadable selects them"},
	{dlq.ErrOutsideFamily, "use --to to restore elsewhere"},
	{dlq.ErrDigest, "--accept-undigested restores a record written without one"},
	{dlq.ErrRecordSignature, "--signing-key-file names the key the archive was signed with"},
}

// flagHints adds to err the flags that act on it (dlqFlags).
func flagHints(err error) error {
	for _, f := range dlqFlags {
		if errors.Is(err, f.err) {
			return fmt.Errorf("%w (%s)", err, f.hint)
		}
	}
	return err
}

// errorsJoin joins the run's error and the audit log's.
func errorsJoin(runErr, auditErr error) error {
	if auditErr != nil {
		auditErr = fmt.Errorf("writing the audit log: %w", auditErr)
	}
	return errors.Join(runErr, auditErr)
}

// unknownSubcommand refuses arguments to a command that only has
// subcommands, with cobra's suggestions ("did you mean replay?").
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return usageError{errors.New(msg)}
}
