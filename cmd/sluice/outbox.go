package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/jmoiron/sqlx"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/sluicesql"
)

// Bounds of the outbox commands.
const (
	// outboxTimeout bounds each command's statements. A retry waits for the
	// rows a relay holds in a batch (PostgreSQL row locks), at most the
	// relay's PublishTimeout plus three StoreTimeouts: a minute by default.
	outboxTimeout = 2 * time.Minute
	// outboxListMax bounds --limit.
	outboxListMax = 10000
)

// outboxFlags are the flags every outbox command shares.
type outboxFlags struct {
	dbURL  string
	tables []string
}

// lastErrorMax bounds a row's error as the list prints it: the relay
// records at most 1,024 bytes.
const lastErrorMax = 1024

func (f *outboxFlags) register(cmd *cobra.Command, many bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.dbURL, "db", localenv.Get("SLUICE_OUTBOX_DB_URL", ""), "PostgreSQL URL of the outbox's database, the inbox's (env SLUICE_OUTBOX_DB_URL)")
	help := "the outbox table (name or schema.name)"
	if many {
		help += "; repeat it, or separate with commas, for several"
	}
	fl.StringSliceVar(&f.tables, "table", []string{"sluice_outbox"}, help)
}

// open connects to --db and returns a store for each --table, which must
// exist, and a context that ends on Ctrl-C or after outboxTimeout; done
// closes what it opened.
func (f *outboxFlags) open(many bool) ([]*sluicesql.Outbox, context.Context, func(), error) {
	if f.dbURL == "" {
		return nil, nil, nil, usageError{fmt.Errorf("--db is required: the PostgreSQL URL of the outbox's database (env SLUICE_OUTBOX_DB_URL)")}
	}
	if len(f.tables) == 0 || (!many && len(f.tables) > 1) {
		return nil, nil, nil, usageError{fmt.Errorf("--table: want one table, got %d", len(f.tables))}
	}
	db, ctx, done, err := openDB(f.dbURL, outboxTimeout)
	if err != nil {
		return nil, nil, nil, err
	}
	stores := make([]*sluicesql.Outbox, 0, len(f.tables))
	for _, name := range f.tables {
		s, err := sluicesql.NewOutbox(db, sluicesql.OutboxConfig{Table: name})
		if err != nil {
			done()
			return nil, nil, nil, usageError{fmt.Errorf("--table %s: %w", diag.Printable(name, 128), err)}
		}
		found, err := tablesExist(ctx, db, name)
		if err != nil {
			err = fmt.Errorf("looking for %s: %w", diag.Printable(name, 128), err)
		}
		if err == nil && !found {
			err = fmt.Errorf("no outbox table %s in that database (check --table and --db: the table of the services' outbox/sluicesql.OutboxConfig.Table, or --table SCHEMA.sluice_outbox for a service.Config.Schema; nothing was created)", diag.Printable(name, 128))
		}
		if err != nil {
			done()
			return nil, nil, nil, diag.RedactError(err)
		}
		stores = append(stores, s)
	}
	return stores, ctx, done, nil
}

// openDB opens the PostgreSQL database at url (--db) and pings it, and
// returns a context that ends on Ctrl-C or after timeout; done closes
// them. Its errors name --db and carry no password.
func openDB(url string, timeout time.Duration) (*sqlx.DB, context.Context, func(), error) {
	sig, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	db, err := openPostgres(sig, url)
	if err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("--db: %w", err)
	}
	ctx, cancel := context.WithTimeout(sig, timeout)
	return db, ctx, func() { cancel(); stop(); _ = db.Close() }, nil
}

func newOutbox(g *globals, out io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "See what waits in a transactional outbox table, make its failing rows due again, requeue or discard its dead rows",
		Long: "The outbox (sluicesql.Outbox) holds what handlers produced until a relay has published it\n" +
			"and the broker confirmed it. A row that could not be published stays, with its error and\n" +
			"its next attempt: never delete one (the event would be lost). A row that failed the relay's\n" +
			"MaxAttempts is set aside as dead: requeue it once the cause is fixed, or discard it, with a\n" +
			"reason recorded in the audit log. See docs/operations.md.",
		Args: unknownSubcommand,
	}
	cmd.AddCommand(newOutboxStats(out), newOutboxList(out), newOutboxRetry(out), newOutboxSettle(g, out, "requeue"), newOutboxSettle(g, out, "discard"))
	return cmd
}

func newOutboxStats(out io.Writer) *cobra.Command {
	var f outboxFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Count the rows waiting in each outbox table: pending, failing, and the oldest's age",
		Long: "pending counts every row not yet relayed, failing ones included; failing, the rows whose\n" +
			"last publish failed; dead, the rows set aside after the relay's MaxAttempts; oldest is the age of the oldest row (what sluice_outbox_oldest_age_seconds\n" +
			"reports while a relay runs). Read-only.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			stores, ctx, done, err := f.open(true)
			if err != nil {
				return err
			}
			defer done()
			t := table.NewWriter()
			t.SetOutputMirror(out)
			t.SetStyle(table.StyleLight)
			t.AppendHeader(table.Row{"table", "pending", "failing", "dead", "oldest"})
			for _, s := range stores {
				st, err := s.Stats(ctx)
				if err != nil {
					return diag.RedactError(err)
				}
				age := cmp.Or(st.OldestAge, outboxAge(st.Oldest)) // on the database's clock
				if asJSON {
					rec := outboxStatsJSON{Table: s.Name(), Pending: st.Pending, Failing: st.Failing, Dead: st.Dead, OldestAgeSeconds: age.Seconds()}
					if !st.Oldest.IsZero() {
						oldest := st.Oldest.UTC()
						rec.Oldest = &oldest
					}
					if err := writeJSON(out, rec); err != nil {
						return err
					}
					continue
				}
				oldest := "-"
				if !st.Oldest.IsZero() {
					oldest = fmt.Sprintf("%s (%s)", age.Round(time.Second), st.Oldest.UTC().Format(time.RFC3339))
				}
				t.AppendRow(table.Row{diag.Printable(s.Name(), 128), st.Pending, st.Failing, st.Dead, oldest})
			}
			if !asJSON {
				t.Render()
			}
			return nil
		},
	}
	f.register(cmd, true)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object per table")
	return cmd
}

// outboxStatsJSON is one table's line of stats --json.
type outboxStatsJSON struct {
	Table            string     `json:"table"`
	Pending          int64      `json:"pending"`
	Failing          int64      `json:"failing"`
	Dead             int64      `json:"dead"`
	Oldest           *time.Time `json:"oldest"` // null when the table is empty
	OldestAgeSeconds float64    `json:"oldest_age_seconds"`
}

// outboxRowJSON is one row's line of list --json: its text exact.
type outboxRowJSON struct {
	ID            int64     `json:"id"`
	Topic         string    `json:"topic"`
	MessageID     string    `json:"message_id"`
	EventID       string    `json:"event_id"`
	Attempts      int       `json:"attempts"`
	CreatedAt     time.Time `json:"created_at"`
	NextAttemptAt time.Time `json:"next_attempt_at"`
	LastError     string    `json:"last_error"`
	// DeadAt is when the relay set the row aside; null while it is tried.
	DeadAt *time.Time `json:"dead_at"`
}

// outboxAge is how long ago t was, never negative (the database's clock
// may be ahead of this host's).
func outboxAge(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return max(time.Since(t), 0)
}

func newOutboxList(out io.Writer) *cobra.Command {
	var f outboxFlags
	var failing, dead, asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show an outbox table's rows, oldest first: topic, ids, attempts, next attempt, last error",
		Long: "Shows the rows the relay takes first. The topic, the ids and the error are the producers'\n" +
			"and the broker's text: escaped and bounded, never printed raw; --json keeps them exact\n" +
			"(escaped as JSON). The payloads are not shown. Read-only.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if limit < 1 || limit > outboxListMax {
				return usageError{fmt.Errorf("--limit %d: want 1 to %d", limit, outboxListMax)}
			}
			if failing && dead {
				return usageError{fmt.Errorf("--failing and --dead: choose one")}
			}
			which, whichName := sluicesql.OutboxAll, "rows"
			switch {
			case failing:
				which, whichName = sluicesql.OutboxFailing, "failing rows"
			case dead:
				which, whichName = sluicesql.OutboxDead, "dead rows"
			}
			stores, ctx, done, err := f.open(false)
			if err != nil {
				return err
			}
			defer done()
			s := stores[0]
			entries, err := s.List(ctx, which, limit)
			if err != nil {
				return diag.RedactError(err)
			}
			if asJSON {
				for _, e := range entries {
					rec := outboxRowJSON{ID: e.ID, Topic: e.Topic, MessageID: e.MessageID, EventID: e.EventID, Attempts: e.Attempts,
						CreatedAt: e.CreatedAt.UTC(), NextAttemptAt: e.NextAttempt.UTC(), LastError: e.LastError}
					if !e.DeadAt.IsZero() {
						deadAt := e.DeadAt.UTC()
						rec.DeadAt = &deadAt
					}
					if err := writeJSON(out, rec); err != nil {
						return err
					}
				}
				return nil
			}
			st, err := s.Stats(ctx)
			if err != nil {
				return diag.RedactError(err)
			}
			outboxTable(out, entries)
			fmt.Fprintf(out, "%d %s shown, oldest first; %s holds %d pending, %d failing, %d dead\n",
				len(entries), whichName, diag.Printable(s.Name(), 128), st.Pending, st.Failing, st.Dead)
			return nil
		},
	}
	f.register(cmd, false)
	cmd.Flags().BoolVar(&failing, "failing", false, "only the rows whose last publish failed (still tried)")
	cmd.Flags().BoolVar(&dead, "dead", false, "only the dead rows: set aside after the relay's MaxAttempts, waiting for requeue or discard")
	cmd.Flags().IntVar(&limit, "limit", 20, fmt.Sprintf("show at most this many rows (1 to %d)", outboxListMax))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object per row")
	return cmd
}

// outboxTable prints rows of an outbox, their text escaped and bounded.
func outboxTable(out io.Writer, entries []sluicesql.OutboxEntry) {
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"id", "topic", "message id", "event id", "attempts", "age", "next attempt", "last error"})
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 8, WidthMax: 72, WidthMaxEnforcer: text.WrapSoft}})
	for _, e := range entries {
		next := "due"
		if d := time.Until(e.NextAttempt); d > 0 {
			next = "in " + d.Round(time.Second).String()
		}
		if !e.DeadAt.IsZero() {
			next = "dead " + outboxAge(e.DeadAt).Round(time.Second).String() + " ago"
		}
		// The error whole (the relay bounds it when it records it): a
		// broker's reason comes after a prefix that would fill a cell.
		t.AppendRow(table.Row{e.ID, diag.Printable(e.Topic, cellMax), orDash(diag.Printable(e.MessageID, 64)), orDash(diag.Printable(e.EventID, cellMax)),
			e.Attempts, outboxAge(e.CreatedAt).Round(time.Second), next, orDash(diag.Printable(e.LastError, lastErrorMax))})
	}
	t.Render()
}

func newOutboxRetry(out io.Writer) *cobra.Command {
	var f outboxFlags
	cmd := &cobra.Command{
		Use:   "retry",
		Short: "Make every failing row of an outbox table due now (after fixing the cause)",
		Long: "A failing row waits for its next attempt, up to the relay's RetryMax. Once the cause is\n" +
			"fixed (the queue declared, the binding added, the permission granted), retry makes every\n" +
			"failing row due: the relays publish them at their next poll. Nothing is deleted or sent\n" +
			"by this command; a row that fails again keeps its error and waits again.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			stores, ctx, done, err := f.open(false)
			if err != nil {
				return err
			}
			defer done()
			s := stores[0]
			n, err := s.RetryNow(ctx)
			if err != nil {
				return diag.RedactError(err)
			}
			fmt.Fprintf(out, "%d failing rows of %s are due now: the relays publish them at their next poll (see sluice outbox stats)\n",
				n, diag.Printable(s.Name(), 128))
			return nil
		},
	}
	f.register(cmd, false)
	return cmd
}

// newOutboxSettle is requeue or discard: what an operator does with dead
// rows, each run recorded in the audit log with its reason and rows.
func newOutboxSettle(g *globals, out io.Writer, verb string) *cobra.Command {
	var f outboxFlags
	var ids []int64
	var allDead bool
	var reason string
	short := "Make dead rows pending again, due now, their attempts counted from zero (after fixing the cause)"
	long := "A dead row failed the relay's MaxAttempts and is tried no more. Once the cause is fixed\n" +
		"(the queue declared, the producer's bug fixed), requeue makes it pending and due now, with\n" +
		"its attempts counted from zero: the relays publish it at their next poll. Only dead rows\n" +
		"are touched. The run is recorded in the audit log: operator, reason, rows."
	if verb == "discard" {
		short = "Delete dead rows for good, with a reason recorded in the audit log (their events are never published)"
		long = "A dead row failed the relay's MaxAttempts and is tried no more. discard deletes it: its\n" +
			"event is never published. Only dead rows are touched (a pending row is never deleted).\n" +
			"The run is recorded in the audit log: operator, reason, and each row's topic and ids."
	}
	cmd := &cobra.Command{
		Use:   verb,
		Short: short,
		Long:  long,
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			if strings.TrimSpace(reason) == "" {
				return usageError{fmt.Errorf("--reason is required: say why these rows are %s", map[string]string{"requeue": "requeued", "discard": "discarded"}[verb])}
			}
			if (len(ids) == 0) == !allDead {
				return usageError{fmt.Errorf("give the rows: --id (repeat it, or separate with commas) or --all-dead")}
			}
			if err := g.checkWrite(); err != nil {
				return err
			}
			stores, ctx, done, err := f.open(false)
			if err != nil {
				return err
			}
			defer done()
			s := stores[0]
			act := s.Requeue
			if verb == "discard" {
				act = s.Discard
			}
			settled, runErr := act(ctx, ids)
			rec := dlq.AuditRecord{Time: time.Now().UTC(), Operator: g.operator, Command: "outbox " + verb, Queue: s.Name(),
				Filters: map[string]string{"rows": outboxSelection(ids)}, Outcome: "ok", Reason: reason,
				Result: dlq.Result{Selected: len(settled), Replayed: len(settled), ByTarget: map[string]int{}}}
			for _, r := range settled {
				rec.Result.ByTarget[r.Topic]++
				rec.Items = append(rec.Items, fmt.Sprintf("row %d: event %s, message %s, topic %s", r.ID, r.EventID, r.MessageID, r.Topic))
			}
			if runErr != nil {
				runErr = diag.RedactError(runErr)
				rec.Outcome, rec.Error = "error", runErr.Error()
			}
			if err := errorsJoin(runErr, dlq.AppendAudit(g.audit, rec)); err != nil {
				return err
			}
			what := "are pending again, due now: the relays publish them at their next poll"
			if verb == "discard" {
				what = "are deleted: their events will not be published"
			}
			fmt.Fprintf(out, "%d dead rows of %s %s (recorded in the audit log)\n", len(settled), diag.Printable(s.Name(), 128), what)
			return nil
		},
	}
	f.register(cmd, false)
	cmd.Flags().Int64SliceVar(&ids, "id", nil, "the dead rows' ids (sluice outbox list --dead); repeat it, or separate with commas")
	cmd.Flags().BoolVar(&allDead, "all-dead", false, "every dead row of the table")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required), recorded in the audit log")
	return cmd
}

// outboxSelection describes the rows a requeue or discard was given.
func outboxSelection(ids []int64) string {
	if len(ids) == 0 {
		return "all dead"
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatInt(id, 10)
	}
	return "ids " + strings.Join(parts, ",")
}
