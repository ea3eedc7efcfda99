package main

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jmoiron/sqlx"
	"github.com/mattn/go-isatty"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/cmd/internal/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/localenv"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
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

func (f *filterFlags) filter() (dlq.Filter, error) {
	var out dlq.Filter
	if f.queue == "" {
		return out, usageError{fmt.Errorf("--queue is required")}
	}
	if f.limit < 0 {
		return out, usageError{fmt.Errorf("--limit must not be negative")}
	}
	for _, c := range f.classes {
		if reason, ok := strings.CutPrefix(c, dlq.BrokerClassPrefix); ok && reason != "" {
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
		if err := dlq.CheckAudit(g.audit); err != nil {
			return filter, nil, nil, nil, err
		}
	}
	conn, err := connect(g)
	if err != nil {
		return filter, nil, nil, nil, err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	return filter, conn, ctx, func() { cancel(); _ = conn.Close() }, nil
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
	tlsCfg, err := g.tls()
	if err != nil {
		return nil, err
	}
	return rabbitmq.NewPublisher(rabbitmq.PublisherConfig{URL: g.url(), TLS: tlsCfg})
}

func connect(g *globals) (*amqp.Connection, error) {
	tlsCfg, err := g.tls()
	if err != nil {
		return nil, err
	}
	return rabbitmq.Dial(g.url(), rabbitmq.DialConfig{Name: "sluice cli", TLS: tlsCfg})
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

func newStats(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var asJSON bool
	var top int
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Count a poison queue's messages by class, error fingerprint and event type",
		Long: "Reads every message of the queue and returns all of them: they stay in the queue,\n" +
			"in order (marked redelivered; on a quorum queue each look counts one delivery, see inspect).\n" +
			"The error fingerprint is the reason with ids and numbers normalised.\n" +
			"Each group shows its --top most frequent values and counts the rest as (other), in memory\n" +
			"bounded whatever the queue holds.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if top < 1 || top > dlq.TopMax {
				return usageError{fmt.Errorf("--top %d: want 1 to %d", top, dlq.TopMax)}
			}
			f, conn, ctx, done, err := ff.open(g, false)
			if err != nil {
				return err
			}
			defer done()
			s, err := dlq.ReadStats(ctx, conn, ff.queue, f, top)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(out, s)
			}
			queue := diag.Printable(ff.queue, 255)
			if s.Skipped > 0 {
				fmt.Fprintf(out, "%s: %d of %d messages match the filter (%d skipped)", queue, s.Total, s.Scanned, s.Skipped)
			} else {
				fmt.Fprintf(out, "%s: %d messages", queue, s.Total)
			}
			if s.Items < s.Total { // copies of one delivery made twice (an uncertain publish)
				fmt.Fprintf(out, " (%d items: copies with one identity count once)", s.Items)
			}
			if !s.Oldest.IsZero() {
				fmt.Fprintf(out, ", poisoned from %s to %s", s.Oldest.Format(time.RFC3339), s.Newest.Format(time.RFC3339))
			}
			fmt.Fprintln(out)
			for _, grp := range []struct {
				title  string
				counts map[string]int
				other  int
			}{{"class", s.ByClass, s.Other.Class}, {"error fingerprint", s.ByFingerprint, s.Other.Fingerprint}, {"event type", s.ByEventType, s.Other.EventType}} {
				fmt.Fprintln(out)
				countTable(out, grp.title, grp.counts, grp.other)
			}
			if s.Unreadable > 0 {
				fmt.Fprintln(out)
				unreadableTable(out, s)
			}
			if len(s.Approximate) > 0 {
				fmt.Fprintf(out, "\nmore than %d different values of %s: their counts are lower bounds, the rest is in (other)\n",
					dlq.Capacity(s.Top), strings.Join(s.Approximate, ", "))
			}
			return nil
		},
	}
	ff.register(cmd, "unused")
	_ = cmd.Flags().MarkHidden("limit")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&top, "top", dlq.TopDefault, fmt.Sprintf("show the N most frequent values of each group, the rest as one (other) row (at most %d)", dlq.TopMax))
	return cmd
}

// countTable prints a group's counts, the most frequent first, and other:
// the messages under no value shown.
func countTable(out io.Writer, title string, counts map[string]int, other int) {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if counts[keys[i]] != counts[keys[j]] {
			return counts[keys[i]] > counts[keys[j]]
		}
		return keys[i] < keys[j]
	})
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{title, "messages"})
	for _, k := range keys { // message contents: escaped and bounded
		t.AppendRow(table.Row{diag.Printable(k, cellMax), counts[k]})
	}
	if other > 0 {
		t.AppendRow(table.Row{"(other)", other})
	}
	t.Render()
}

// unreadableTable names the messages whose headers could not be read.
func unreadableTable(out io.Writer, s dlq.Stats) {
	fmt.Fprintf(out, "%d messages whose headers could not be parsed (remove them with `sluice dlq discard --unreadable`):\n", s.Unreadable)
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"position", "message id", "body bytes", "reason"})
	for _, u := range s.UnreadableFirst {
		t.AppendRow(table.Row{u.Position, orDash(diag.Printable(u.MessageID, 64)), u.BodyBytes, diag.Printable(u.Reason, cellMax)})
	}
	if n := s.Unreadable - len(s.UnreadableFirst); n > 0 {
		t.AppendRow(table.Row{"", fmt.Sprintf("(%d more)", n), "", ""})
	}
	t.Render()
}

func newInspect(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var asJSON bool
	var preview int
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show messages of a poison queue with their diagnosis and a payload preview",
		Long: "Takes each message without acknowledging it and returns all of them when it ends, one\n" +
			"basic.nack each in the order read (the broker returns them too if the tool is killed):\n" +
			"nothing is removed, the order is kept, and the messages are marked redelivered. On a quorum\n" +
			"queue the messages returned before wait at its head: a run that stops among them reads on\n" +
			"to the first one never returned, to keep the order, and each message read counts one\n" +
			"delivery in its x-delivery-count (RabbitMQ 3.x-4.2). The poison queue `sluice topology`\n" +
			"declares has a delivery limit no reading reaches.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			f, conn, ctx, done, err := ff.open(g, false)
			if err != nil {
				return err
			}
			defer done()
			// Streamed: one message in memory at a time, whatever the queue holds.
			shown := 0
			n, err := dlq.Each(ctx, conn, ff.queue, f, ff.limit, func(m *dlq.Message) error {
				if asJSON {
					rec := map[string]any{"uuid": m.Msg.UUID, "position": m.Position, "metadata": m.Msg.Metadata}
					if utf8.Valid(m.Msg.Payload) {
						rec["payload"] = string(m.Msg.Payload)
					} else { // bytes kept losslessly, and said so
						rec["payload_base64"] = base64.StdEncoding.EncodeToString(m.Msg.Payload)
					}
					return writeJSON(out, rec)
				}
				shown++
				inspectTable(out, shown, m, preview)
				return nil
			})
			if err != nil || asJSON {
				return err
			}
			fmt.Fprintf(out, "%d messages shown; all are back in %s\n", n, diag.Printable(ff.queue, 255))
			return nil
		},
	}
	ff.register(cmd, "show at most this many messages (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&preview, "preview", 200, "payload bytes shown")
	return cmd
}

// inspectTable prints one message's diagnosis and payload preview, escaped
// and bounded.
func inspectTable(out io.Writer, i int, m *dlq.Message, preview int) {
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetStyle(table.StyleLight)
	t.SetTitle(fmt.Sprintf("%d. %s (event %s)", i, diag.Printable(m.Class, 32), orDash(diag.Printable(m.EventID, cellMax))))
	for _, row := range [][2]string{
		{"reason", diag.Printable(m.Reason, cellMax)}, {"event type", diag.Printable(m.EventType, cellMax)},
		{"consumer", diag.Printable(m.Consumer, cellMax)}, {"queue", diag.Printable(cmp.Or(m.Queue, m.DeadLetterQueue), cellMax)},
		{"attempts", diag.Printable(m.Attempts, 32)}, {"poisoned at", formatTime(m.PoisonedAt)}, {"trace id", diag.Printable(m.TraceID, 64)},
		{"payload", diag.Printable(string(m.Msg.Payload), preview)},
	} {
		if row[0] == "payload" && m.HeadersError != "" { // nothing above was readable: name it
			t.AppendRow(table.Row{"headers", "not parsed: " + diag.Printable(m.HeadersError, cellMax)})
			t.AppendRow(table.Row{"position", m.Position})
			t.AppendRow(table.Row{"message id", orDash(diag.Printable(m.Delivery.MessageId, 64))})
			t.AppendRow(table.Row{"body bytes", len(m.Msg.Payload)})
		}
		t.AppendRow(table.Row{row[0], orDash(row[1])})
	}
	t.Render()
}

// cellMax bounds what a table cell shows of a message's contents, in bytes.
const cellMax = 200

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Format(time.RFC3339)
}

func newReplay(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var lf loopFlags
	var rateFlag, to, keyFile string
	var batch int
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Republish selected messages to their queue, then remove them from the poison queue",
		Long: "Each selected message is published (confirmed, mandatory) to the queue in its\n" +
			"sluice_poison_queue header, with the attempt count reset and replay provenance headers,\n" +
			"and acked in the poison queue only after the confirm. Messages not selected stay, in order.\n" +
			"A publish that fails stops the run with the message still in the poison queue; so does\n" +
			"a kill at any moment (a message may then be in both places: the inbox drops the duplicate).\n\n" +
			"Closed loop (--canary, --ramp, with --outcomes): the messages carry a replay run id; the\n" +
			"consumers' replay stage (router.Stages.Replay) records each one's outcome in the outcome\n" +
			"table. The canary batch must come back all processed (or duplicate); each ramp batch may be\n" +
			"poisoned again at most --max-repoison; after the ramp the last size repeats until nothing\n" +
			"selected is left. A stop prints the events that did not end well and exits 1.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			r, err := parseRate(rateFlag)
			if err != nil {
				return err
			}
			if batch < 1 {
				return usageError{fmt.Errorf("--batch must be at least 1")}
			}
			var sizes []int
			var maxRepoison float64
			if lf.active() {
				if sizes, maxRepoison, err = lf.sizes(); err != nil {
					return err
				}
				if dryRun {
					return usageError{errors.New("--dry-run lists what a replay would move; run it without --canary and --ramp")}
				}
			}
			f, conn, ctx, done, err := ff.open(g, true)
			if err != nil {
				return err
			}
			defer done()
			pub, err := newPublisher(g)
			if err != nil {
				return err
			}
			defer func() { _ = pub.Close() }()

			signer, err := signerFlag(keyFile)
			if err != nil {
				return err
			}
			prog := newProgress(out, ff.queue, queueDepth(conn, ff.queue))
			cfg := dlq.ReplayConfig{
				Queue: ff.queue, Filter: f, Limit: ff.limit, Rate: r, Batch: batch, DryRun: dryRun,
				To: to, Operator: g.operator, Publisher: pub, Progress: prog.update, Signer: signer,
			}
			var res dlq.ReplayResult
			var runErr error
			if lf.active() {
				store, closeStore, err := openOutcomes(lf.outcomes, lf.table)
				if err != nil {
					return err
				}
				defer closeStore()
				cfg.Run = newRun("run")
				cfg.Progress = nil
				res, runErr = closedLoop(ctx, conn, cfg, loop{sizes: sizes, canary: lf.canary > 0, maxRepoison: maxRepoison, store: store, wait: lf.wait}, out)
			} else {
				res, runErr = dlq.Replay(ctx, conn, cfg)
			}
			prog.done()
			summary(out, "replay", ff.queue, res, dryRun)
			opts := map[string]string{"rate": rateFlag, "batch": strconv.Itoa(batch), "limit": strconv.Itoa(ff.limit), "to": to,
				"run": cfg.Run, "canary": strconv.Itoa(lf.canary), "ramp": lf.ramp, "max_repoison": lf.maxRepoison}
			return errorsJoin(runErr, audit(g, "dlq replay", ff.queue, f, opts, res, dryRun, runErr))
		},
	}
	ff.register(cmd, "replay at most this many messages (0: all selected)")
	fl := cmd.Flags()
	fl.StringVar(&rateFlag, "rate", "", "at most this many messages per second, e.g. 20 or 20/s (default: no limit)")
	fl.IntVar(&batch, "batch", 10, "messages published, confirmed and acked together")
	fl.BoolVar(&dryRun, "dry-run", false, "select and count; publish and remove nothing")
	fl.StringVar(&to, "to", "", "replay every message to this queue instead of its sluice_poison_queue")
	fl.StringVar(&keyFile, "signing-key-file", localenv.Get("SLUICE_SIGNING_KEY_FILE", ""),
		"the key the consumers' stages sign and verify with (sluice.NewSignerFromFile): each copy is signed, so the\n"+
			"consumers believe its replay run; a message whose diagnosis is not signed needs --to. Default env SLUICE_SIGNING_KEY_FILE")
	outcomeFlags(fl, &lf.outcomes, &lf.table, "the consumers' replay stage writes")
	fl.IntVar(&lf.canary, "canary", 0, "replay this many first and stop unless all were processed")
	fl.StringVar(&lf.ramp, "ramp", "", "then batches of these sizes, e.g. 5,20,100; the last size repeats")
	fl.StringVar(&lf.maxRepoison, "max-repoison", "10%", "stop when more than this share of a batch is poisoned again")
	fl.DurationVar(&lf.wait, "wait", 2*time.Minute, "how long to wait for a batch's outcomes")
	return cmd
}

func newReport(out io.Writer) *cobra.Command {
	var url, table, run string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Each replayed event's outcome, per replay run; exit 1 while any has none yet",
		Long: "Reads the outcome table the consumers' replay stage writes. For each run: counts by outcome,\n" +
			"then every event that did not end processed or duplicate (poisoned again with its new reason,\n" +
			"rejected, still retrying, or sent with no outcome yet). Exit 1 while any event of the\n" +
			"selected runs has no final outcome: the runbook's confirm step.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if url == "" {
				return usageError{errors.New("--outcomes is required (or env SLUICE_OUTCOMES_URL)")}
			}
			store, closeStore, err := openOutcomes(url, table)
			if err != nil {
				return err
			}
			defer closeStore()
			rs, err := store.Outcomes(context.Background(), run)
			if err != nil {
				return fmt.Errorf("reading the outcomes: %w", diag.RedactError(err))
			}
			if len(rs) == 0 {
				if run != "" { // a mistyped run id must not pass the confirm step
					return fmt.Errorf("no outcome records of run %q in %s (check --run, --outcomes and --outcomes-table)", diag.Printable(run, 128), diag.Printable(table, 128))
				}
				fmt.Fprintf(out, "no replay runs recorded in %s\n", diag.Printable(table, 128))
				return nil
			}
			pending := report(out, rs, asJSON)
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

// report prints the records and returns how many have no final outcome.
func report(out io.Writer, rs []replay.Record, asJSON bool) int {
	pending := 0
	byRun := map[string]map[sluice.Outcome]int{}
	var runs []string
	for _, r := range rs {
		if !replay.Final(r.Outcome) {
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
			replay.OutcomeCompensated, replay.OutcomeArchived, replay.OutcomeDiscarded,
			sluice.OutcomeRetried, sluice.OutcomeParked, sluice.OutcomeHeld, sluice.OutcomeFailed, replay.OutcomeReplayed} {
			if n := byRun[run][o]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, o))
			}
		}
		fmt.Fprintf(out, "run %s: %s\n", diag.Printable(run, 128), strings.Join(parts, ", "))
		for _, r := range rs {
			if r.Run == run && r.Outcome != sluice.OutcomeProcessed && r.Outcome != sluice.OutcomeDuplicate {
				fmt.Fprintf(out, "  %s\t%s\t%s\t%s\n", diag.Printable(cmp.Or(r.EventID, r.Item), 128), diag.Printable(string(r.Outcome), 32), diag.Printable(r.Class, 32), diag.Printable(r.Reason, 200))
			}
		}
	}
	return pending
}

func parseRate(v string) (float64, error) {
	if v == "" {
		return 0, nil
	}
	r, err := strconv.ParseFloat(strings.TrimSuffix(v, "/s"), 64)
	if err != nil || r <= 0 {
		return 0, usageError{fmt.Errorf("--rate %q: want a positive number of messages per second, e.g. 20/s", v)}
	}
	return r, nil
}

func newArchive(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var file, tableName, dbURL, keyFile string
	recs := &operatorRecords{g: g}
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
			sink, closeSink, err := openArchive(file, func(path string) (dlq.ArchiveSink, error) { return dlq.OpenFileSink(path) },
				dbURL, func(db *sqlx.DB) (dlq.ArchiveSink, error) { return dlq.NewTableSink(ctx, db, tableName) })
			if err != nil { // nothing moved; the attempt is audited
				return errorsJoin(err, audit(g, "dlq archive", ff.queue, f, opts, dlq.ReplayResult{}, false, err))
			}
			defer closeSink()
			res, runErr := dlq.Archive(ctx, conn, dlq.ArchiveConfig{Queue: ff.queue, Filter: f, Limit: ff.limit, Sink: sink, Operator: g.operator, Signer: signer,
				Archived: func(m *dlq.Message) {
					recs.add(replay.OutcomeArchived, m.Item(), m.EventID, m.Class, "archived to "+sink.Name())
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
		"sign each record with this key (sluice.NewSignerFromFile), for restore --signing-key-file to check. Default env SLUICE_SIGNING_KEY_FILE")
	return cmd
}

// signerFlag is the Signer of a --signing-key-file, nil without one.
func signerFlag(keyFile string) (*sluice.Signer, error) {
	if keyFile == "" {
		return nil, nil
	}
	signer, err := sluice.NewSignerFromFile(keyFile)
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
func openArchive[T io.Closer](file string, openFile func(string) (T, error), dbURL string, openTable func(*sqlx.DB) (T, error)) (_ T, done func(), _ error) {
	var none T
	if file != "" {
		f, err := openFile(file)
		if err != nil {
			return none, nil, err
		}
		return f, func() { _ = f.Close() }, nil
	}
	db, err := sqlx.Open("postgres", dbURL)
	if err != nil {
		return none, nil, fmt.Errorf("--db: %w", diag.RedactError(err))
	}
	t, err := openTable(db)
	if err != nil {
		_ = db.Close()
		return none, nil, diag.RedactError(err)
	}
	return t, func() { _ = t.Close(); _ = db.Close() }, nil
}

func newDiscard(g *globals, out io.Writer) *cobra.Command {
	var ff filterFlags
	var reason string
	var dryRun bool
	recs := &operatorRecords{g: g}
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
			f, conn, ctx, done, err := ff.open(g, true)
			if err != nil {
				return err
			}
			defer done()
			res, items, runErr := dlq.Discard(ctx, conn, ff.queue, f, ff.limit, dryRun)
			summary(out, "discard", ff.queue, res, dryRun)
			var run string
			if !dryRun {
				for _, it := range items {
					recs.add(replay.OutcomeDiscarded, it, it, "", reason)
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
			if err := dlq.CheckAudit(g.audit); err != nil {
				return err
			}
			for _, e := range events {
				recs.add(replay.OutcomeCompensated, e, e, "", reason)
			}
			_, runErr := recs.flush(context.Background(), run)
			if runErr == nil {
				fmt.Fprintf(out, "%d events of run %s recorded compensated\n", len(events), diag.Printable(run, 128))
			}
			rec := auditRecord(g, "dlq resolve", "", dlq.Filter{}, map[string]string{"run": run}, dlq.ReplayResult{Replayed: len(events)}, false, runErr)
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

// register adds --outcomes and --outcomes-table.
func (o *operatorRecords) register(cmd *cobra.Command, help string) {
	outcomeFlags(cmd.Flags(), &o.url, &o.table, help)
}

// outcomeFlags registers --outcomes and --outcomes-table; what says what
// the records are for.
func outcomeFlags(fl *pflag.FlagSet, url, table *string, what string) {
	fl.StringVar(url, "outcomes", localenv.Get("SLUICE_OUTCOMES_URL", ""),
		"the outcome records "+what+": a PostgreSQL URL (the outcome table), or a redis:// URL (replay/redisstore) (env SLUICE_OUTCOMES_URL)")
	fl.StringVar(table, "outcomes-table", replay.TableDefault, "the outcome table (name or schema.name); on Redis the key prefix, without its colon")
}

// printRun names the run an operator's records went under.
func printRun(out io.Writer, run string) {
	if run != "" {
		fmt.Fprintf(out, "outcomes recorded as run %s\n", run)
	}
}

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
			if err := dlq.CheckAudit(g.audit); err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
			defer cancel()
			src, closeSrc, err := openArchive(from, func(path string) (dlq.RestoreSource, error) { return dlq.OpenFileSource(path) },
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
			res, runErr := dlq.Restore(ctx, dlq.RestoreConfig{Source: src, To: to, EventIDs: eventIDs, Limit: limit, Publisher: pub, DryRun: dryRun,
				Signer: signer, AcceptUndigested: undigested})
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

func summary(out io.Writer, what, queue string, res dlq.ReplayResult, dryRun bool) {
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

func audit(g *globals, command, queue string, f dlq.Filter, opts map[string]string, res dlq.ReplayResult, dryRun bool, runErr error) error {
	return dlq.AppendAudit(g.audit, auditRecord(g, command, queue, f, opts, res, dryRun, runErr))
}

func auditRecord(g *globals, command, queue string, f dlq.Filter, opts map[string]string, res dlq.ReplayResult, dryRun bool, runErr error) dlq.AuditRecord {
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

// errorsJoin joins the run's error and the audit log's.
func errorsJoin(runErr, auditErr error) error {
	if auditErr != nil {
		auditErr = fmt.Errorf("writing the audit log: %w", auditErr)
	}
	return errors.Join(runErr, auditErr)
}

// progressView shows a progress bar on a terminal, plain lines otherwise.
type progressView struct {
	out     io.Writer
	pw      progress.Writer
	tracker *progress.Tracker
	last    int
	total   int
}

// queueDepth is queue's ready messages now, or 0 when it cannot be read.
func queueDepth(conn *amqp.Connection, queue string) int {
	ch, err := conn.Channel()
	if err != nil {
		return 0
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0
	}
	return q.Messages
}

// newProgress shows a replay's progress; total is the queue's depth at the
// start (0: unknown), the most that can be replayed.
func newProgress(out io.Writer, queue string, total int) *progressView {
	v := &progressView{out: out, total: total}
	raw := out // the bar draws with escape sequences of its own
	if t, ok := out.(interface{ Unwrap() io.Writer }); ok {
		raw = t.Unwrap()
	}
	if f, ok := raw.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		v.pw = progress.NewWriter()
		v.pw.SetOutputWriter(raw)
		v.pw.SetUpdateFrequency(100 * time.Millisecond)
		v.tracker = &progress.Tracker{Message: "replaying from " + diag.Printable(queue, 255), Total: int64(total), Units: progress.UnitsDefault}
		v.pw.AppendTracker(v.tracker)
		go v.pw.Render()
	}
	return v
}

func (v *progressView) update(done int) {
	if v.tracker != nil {
		v.tracker.SetValue(int64(done))
		return
	}
	if done-v.last >= 100 || v.last == 0 {
		if v.total > 0 {
			fmt.Fprintf(v.out, "replayed %d (the queue held %d at the start)\n", done, v.total)
		} else {
			fmt.Fprintf(v.out, "replayed %d\n", done)
		}
		v.last = done
	}
}

func (v *progressView) done() {
	if v.pw != nil {
		v.tracker.MarkAsDone()
		time.Sleep(150 * time.Millisecond) // the last render
		v.pw.Stop()
	}
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
