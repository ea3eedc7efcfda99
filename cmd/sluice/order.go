package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/ordering"

	"github.com/sluicemq/sluice/sluicesql"
)

// Bounds of the order commands.
const (
	orderTimeout = time.Minute
	orderListMax = 10000
)

// orderFlags are the flags every order command shares.
type orderFlags struct {
	dbURL, prefix, consumer string
}

func (f *orderFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.dbURL, "db", localenv.Get("SLUICE_ORDER_DB_URL", ""), "PostgreSQL URL of the inbox's database, where the ordering stage keeps its keys (env SLUICE_ORDER_DB_URL)")
	fl.StringVar(&f.prefix, "table-prefix", "sluice_order", "the ordering tables' prefix (<prefix>_keys, <prefix>_held; name or schema.name)")
	fl.StringVar(&f.consumer, "consumer", "", "the handler (ordering.Config.Consumer: the handler's name given to router.Add); required")
}

// open connects to --db and returns the store, which must exist, and a
// context that ends on Ctrl-C or after orderTimeout; done closes them.
func (f *orderFlags) open() (ordering.Store, context.Context, func(), error) {
	if f.dbURL == "" {
		return nil, nil, nil, usageError{fmt.Errorf("--db is required: the PostgreSQL URL of the inbox's database (env SLUICE_ORDER_DB_URL)")}
	}
	if strings.TrimSpace(f.consumer) == "" {
		return nil, nil, nil, usageError{fmt.Errorf("--consumer is required: the handler's name")}
	}
	db, ctx, done, err := openDB(f.dbURL, orderTimeout)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := sluicesql.NewOrders(db, sluicesql.OrdersConfig{TablePrefix: f.prefix})
	if err != nil {
		done()
		return nil, nil, nil, usageError{fmt.Errorf("--table-prefix %s: %w", diag.Printable(f.prefix, 128), err)}
	}
	found, err := tablesExist(ctx, db, f.prefix+"_keys", f.prefix+"_held")
	if err != nil {
		done()
		return nil, nil, nil, diag.RedactError(fmt.Errorf("looking for %s_keys: %w", diag.Printable(f.prefix, 128), err))
	}
	if !found {
		done()
		return nil, nil, nil, fmt.Errorf("no ordering tables %s_keys and %s_held in that database (--table-prefix; sluicesql's Migrate makes them)",
			diag.Printable(f.prefix, 128), diag.Printable(f.prefix, 128))
	}
	return s, ctx, done, nil
}

func newOrder(g *globals, out io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "order",
		Short: "The keys the ordering stage holds: list them, skip a head (audited)",
		Long: "A handler with the ordering stage (router.Stages.Order) keeps each key's messages in order:\n" +
			"a key whose delivery went to a retry tier or the poison queue waits for it, its later messages\n" +
			"held in the inbox's database. list shows the waiting keys; skip gives up a key's head so that\n" +
			"what it holds is released in order without it. See docs/ordering.md.",
	}
	cmd.AddCommand(newOrderList(out), newOrderSkip(g, out))
	return cmd
}

func newOrderList(out io.Writer) *cobra.Command {
	var f orderFlags
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the waiting keys, the oldest first: head, state, messages held, age, the head's reason",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			if limit < 1 || limit > orderListMax {
				return usageError{fmt.Errorf("--limit: want 1 to %d, got %d", orderListMax, limit)}
			}
			s, ctx, done, err := f.open()
			if err != nil {
				return err
			}
			defer done()
			keys, err := s.Keys(ctx, f.consumer, limit)
			if err != nil {
				return diag.RedactError(err)
			}
			if asJSON {
				for _, k := range keys {
					if err := writeJSON(out, orderKeyJSON{Key: k.Key, Head: k.Head, State: orderState(k), Held: k.Held, Since: k.Since.UTC(), Reason: diag.Redact(k.Reason)}); err != nil {
						return err
					}
				}
				return nil
			}
			t := table.NewWriter()
			t.SetOutputMirror(out)
			t.SetStyle(table.StyleLight)
			t.AppendHeader(table.Row{"key", "head", "state", "held", "waiting for", "reason"})
			for _, k := range keys {
				t.AppendRow(table.Row{diag.Printable(k.Key, 64), diag.Printable(k.Head, 64), orderState(k), k.Held,
					outboxAge(k.Since).Round(time.Second), diag.Printable(diag.Redact(k.Reason), 120)})
			}
			t.Render()
			if len(keys) == 0 {
				fmt.Fprintln(out, "no key waits")
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many keys")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object per key, its text exact")
	return cmd
}

// orderKeyJSON is one key's line of list --json.
type orderKeyJSON struct {
	Key    string    `json:"key"`
	Head   string    `json:"head"`
	State  string    `json:"state"`
	Held   int       `json:"held"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason"`
}

// orderState names what a waiting key waits for.
func orderState(k ordering.Key) string {
	switch {
	case k.Head == "":
		return "releasing"
	case k.Poisoned:
		return "poisoned"
	}
	return "blocked"
}

func newOrderSkip(g *globals, out io.Writer) *cobra.Command {
	var f orderFlags
	var keys []string
	var reason string
	cmd := &cobra.Command{
		Use:   "skip",
		Short: "Give up a waiting key's head: what the key holds is released in order without it (audited)",
		Long: "A key whose head is in the poison queue waits until its head is replayed (sluice dlq replay:\n" +
			"once it succeeds, the key's held messages follow it) or skipped. skip gives the head up: the\n" +
			"handler releases what the key holds, in order, at the key's next delivery or within its\n" +
			"ResumeInterval. The head stays where it is (the poison queue, a tier): replayed later, it runs\n" +
			"out of order. The run is recorded in the audit log: operator, reason, each key and its head.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if strings.TrimSpace(reason) == "" {
				return usageError{fmt.Errorf("--reason is required: say why these heads are skipped")}
			}
			if len(keys) == 0 {
				return usageError{fmt.Errorf("--key is required: the waiting keys (sluice order list); repeat it, or separate with commas")}
			}
			if err := g.checkWrite(); err != nil {
				return err
			}
			s, ctx, done, err := f.open()
			if err != nil {
				return err
			}
			defer done()
			rec := dlq.AuditRecord{Time: time.Now().UTC(), Operator: g.operator, Command: "order skip", Queue: f.consumer,
				Filters: map[string]string{"keys": strconv.Itoa(len(keys))}, Outcome: "ok", Reason: reason,
				Result: dlq.Result{Selected: len(keys), ByTarget: map[string]int{}}}
			var runErr error
			for _, key := range keys {
				st, skipped, err := ordering.Skip(ctx, s, f.consumer, key)
				if err != nil {
					runErr = diag.RedactError(err)
					break
				}
				if !skipped {
					fmt.Fprintf(out, "key %s: not waiting for a head (nothing to skip)\n", diag.Printable(key, 64))
					continue
				}
				rec.Result.Replayed++
				rec.Items = append(rec.Items, fmt.Sprintf("key %s: head %s skipped", diag.Printable(key, 200), diag.Printable(st.Head, 200)))
				fmt.Fprintf(out, "key %s: head %s skipped; what it holds is released in order\n",
					diag.Printable(key, 64), diag.Printable(st.Head, 64))
				fmt.Fprintf(out, "  warning: %s stays where it is (the poison queue, a tier): replayed later, it applies after the key's later messages,\n"+
					"  out of order (the consumer logs it; its replay outcome says so). Archive or discard it if it must not apply late.\n",
					diag.Printable(st.Head, 64))
			}
			if runErr != nil {
				rec.Outcome, rec.Error = "error", runErr.Error()
			}
			return errorsJoin(runErr, dlq.AppendAudit(g.audit, rec))
		},
	}
	f.register(cmd)
	cmd.Flags().StringSliceVar(&keys, "key", nil, "the waiting keys whose heads to skip; repeat it, or separate with commas")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required), recorded in the audit log")
	return cmd
}
