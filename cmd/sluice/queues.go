package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/localenv"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/amqpcall"
	"github.com/sluicemq/sluice/internal/diag"
)

// queueRow is one queue of a family in `sluice queues`.
type queueRow struct {
	Family string `json:"family"`
	Queue  string `json:"queue"`
	Role   string `json:"role"` // main, tier <delay>, poison
	Ready  int    `json:"ready"`
	// Unacked is the messages delivered and not yet acked, from the
	// management API (absent without --management-url).
	Unacked *int `json:"unacked,omitempty"`
	// Messages is every message the broker counts in the queue, from the
	// management API: ready, unacked, and — on a quorum queue — copies it
	// holds in no other state, such as those waiting to be dead-lettered
	// while the target queue has no leader (Held).
	Messages  *int `json:"messages,omitempty"`
	Consumers int  `json:"consumers"`
	Missing   bool `json:"missing,omitempty"`
	// OldestPoisonedAt is, for a poison queue, its head message's
	// sluice_poisoned_at: the oldest isolation (the queue is FIFO).
	OldestPoisonedAt time.Time `json:"oldest_poisoned_at,omitzero"`
	// HeadPublishedAt is the AMQP timestamp of the queue's head message as
	// the management API reports it (head_message_timestamp): there when
	// the producer set the property, the queue is a classic one, and its
	// head is ready.
	HeadPublishedAt time.Time `json:"head_published_at,omitzero"`
}

// held is what the broker counts in the queue beyond its ready and unacked
// messages (management API only): a quorum tier's copies waiting on their
// dead-letter target after a node loss (docs/scaling.md).
func (r queueRow) held() int {
	if r.Messages == nil || r.Unacked == nil || r.Missing {
		return 0
	}
	return max(0, *r.Messages-r.Ready-*r.Unacked)
}

// age is the table's "oldest" cell: the oldest poisoning of a poison queue,
// else the age of the head message's AMQP timestamp, else "-".
func (r queueRow) age(now time.Time) string {
	switch {
	case !r.OldestPoisonedAt.IsZero():
		return now.Sub(r.OldestPoisonedAt).Round(time.Second).String() + " (poisoned)"
	case !r.HeadPublishedAt.IsZero():
		return now.Sub(r.HeadPublishedAt).Round(time.Second).String() + " (published)"
	}
	return "-"
}

func newQueues(g *globals, out io.Writer) *cobra.Command {
	var queues []string
	var mgmtURL string
	var lf ladderFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "The queue family of each consumer queue: main, retry tiers, poison; depth, consumers, oldest message",
		Long: "For each --queue: the main queue, its retry tiers and its poison queue, with the messages\n" +
			"ready and the consumers the broker reports, and for the poison queue the age of its oldest\n" +
			"isolation (read from its head message, which stays, marked redelivered). A queue that does\n" +
			"not exist is reported missing. The main and tier queues are not read. AMQP cannot list\n" +
			"queues: name them with --queue, or give --management-url (RabbitMQ's management API; the\n" +
			"credentials and vhost are the AMQP URL's) to list every family the broker has: a queue Q\n" +
			"with Q.poison or Q.retry.* beside it. With it, a family's tiers are the broker's (the\n" +
			"queues Q.retry.<delay>), whatever ladder it was declared with; without it, they are --tiers.\n" +
			"With the management API each queue also shows its unacked messages and, where the\n" +
			"broker reports it (classic queues whose producers set the AMQP timestamp), the age of\n" +
			"its head message.",
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if len(queues) == 0 && mgmtURL == "" {
				return usageError{errors.New("--queue or --management-url is required")}
			}
			lf.given = c.Flags().Changed("tiers")
			if mgmtURL != "" {
				var err error
				if lf.listed, err = listQueues(mgmtURL, g.url()); err != nil {
					return err
				}
			}
			fams, err := lf.families(queues) // named
			if err != nil {
				return err
			}
			listed := lf.listed
			if len(queues) == 0 {
				fams = discover(listed)
			}
			conn, err := connect(g)
			if err != nil {
				return err
			}
			defer func() { _ = amqpcall.Close(context.Background(), conn, callTimeout) }()
			var rows []queueRow
			for _, f := range fams {
				for _, m := range f.queues {
					r, err := row(conn, f.name, m.name, m.role)
					if err != nil {
						return err
					}
					if r.Role == "poison" && !r.Missing && r.Ready > 0 {
						r.OldestPoisonedAt = oldestPoisoning(conn, r.Queue)
					}
					if q, ok := listed[m.name]; ok && !r.Missing {
						r.Unacked, r.Messages = &q.Unacked, &q.Messages
						if q.HeadTimestamp > 0 && r.Ready > 0 {
							r.HeadPublishedAt = time.Unix(int64(q.HeadTimestamp), 0)
						}
					}
					rows = append(rows, r)
				}
			}
			if asJSON {
				for _, r := range rows {
					if err := writeJSON(out, r); err != nil {
						return err
					}
				}
				return nil
			}
			t := table.NewWriter()
			t.SetOutputMirror(out)
			t.SetStyle(table.StyleLight)
			t.AppendHeader(table.Row{"queue", "role", "ready", "unacked", "total", "consumers", "oldest"})
			now := time.Now()
			held := 0
			for _, r := range rows {
				ready, unacked, total, consumers := fmt.Sprint(r.Ready), "-", "-", fmt.Sprint(r.Consumers)
				if r.Unacked != nil {
					unacked = fmt.Sprint(*r.Unacked)
				}
				if r.Messages != nil {
					total = fmt.Sprint(*r.Messages)
					if h := r.held(); h > 0 {
						total += fmt.Sprintf(" (%d held)", h)
						held += h
					}
				}
				if r.Missing {
					ready, total, consumers = "missing", "-", "-"
				}
				t.AppendRow(table.Row{diag.Printable(r.Queue, 255), r.Role, ready, unacked, total, consumers, r.age(now)})
			}
			t.Render()
			lf.otherLadder(out, rows)
			if held > 0 {
				_, err := fmt.Fprintf(out, "%d message(s) held: counted by the broker, neither ready nor unacked — on a quorum queue, copies\n"+
					"waiting to be dead-lettered while their target has no leader (after a node loss); they move on\n"+
					"once it has one (docs/scaling.md, \"What a node loss costs a retry tier\").\n", held)
				return err
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&queues, "queue", nil, "a consumer queue (repeatable)")
	fl.StringVar(&lf.tiers, "tiers", "30s,5m,30m", "the retry tier delays the topology was declared with (with --management-url: read from the broker unless given)")
	fl.StringVar(&lf.poison, "poison-queue", "", "the poison queue (default <queue>.poison)")
	fl.Float64Var(&lf.jitter, "tier-jitter", 0, "the TopologyConfig.TierJitter fraction the topology was declared with (each tier's queues listed)")
	fl.IntVar(&lf.jitterQs, "tier-jitter-queues", 0, "queues per tier with --tier-jitter (default 4)")
	fl.BoolVar(&asJSON, "json", false, "one JSON object per queue")
	fl.StringVar(&mgmtURL, "management-url", localenv.Get("SLUICE_MANAGEMENT_URL", ""), "RabbitMQ's management API, e.g. http://broker:15672, to list every queue family (env SLUICE_MANAGEMENT_URL)")
	return cmd
}

// family is a consumer queue with its tiers and poison queue, as the
// broker's queue names show them.
type family struct {
	name   string
	queues []member // the main queue, the tiers by delay, the poison queue
}

// member is one queue of a family and its role: main, tier <delay>, poison.
type member struct{ name, role string }

// mgmtQueue is what the management API reports of a queue.
type mgmtQueue struct {
	Name     string `json:"name"`
	Unacked  int    `json:"messages_unacknowledged"`
	Messages int    `json:"messages"`
	// HeadTimestamp is the head message's AMQP timestamp in Unix seconds
	// (0: none, or not a classic queue).
	HeadTimestamp unixSeconds `json:"head_message_timestamp"`
}

// unixSeconds is a time in Unix seconds; what is not a number (null, "",
// as brokers report a head without a timestamp) is 0.
type unixSeconds int64

func (u *unixSeconds) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*u = 0
	if f, ok := v.(float64); ok && f > 0 && f < 1<<40 {
		*u = unixSeconds(f)
	}
	return nil
}

// listQueues reads the AMQP URL's vhost's queues from the management API.
func listQueues(mgmtURL, amqpURL string) (map[string]mgmtQueue, error) {
	var listed []mgmtQueue
	if err := mgmtGet(mgmtURL, amqpURL, func(vhost string) string {
		return "/api/queues/" + url.PathEscape(vhost) + "?columns=name,messages,messages_unacknowledged,head_message_timestamp"
	}, "the queues", &listed); err != nil {
		return nil, err
	}
	out := make(map[string]mgmtQueue, len(listed))
	for _, q := range listed {
		out[q.Name] = q
	}
	return out, nil
}

// mgmtGet decodes into v the management API's answer to GET path(vhost),
// the AMQP URL's vhost, with the AMQP URL's credentials; what names the
// resource in errors.
func mgmtGet(mgmtURL, amqpURL string, path func(vhost string) string, what string, v any) error {
	return mgmtGetContext(context.Background(), mgmtURL, amqpURL, path, what, v)
}

// mgmtGetContext is mgmtGet bounded by ctx too.
func mgmtGetContext(ctx context.Context, mgmtURL, amqpURL string, path func(vhost string) string, what string, v any) error {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return errors.New("the AMQP URL does not parse (not shown: it may hold a password)")
	}
	vhost := "/"
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		vhost, _ = url.PathUnescape(p)
	}
	api := strings.TrimSuffix(mgmtURL, "/") + path(vhost)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api, nil)
	if err != nil {
		return usageError{fmt.Errorf("--management-url: %w", diag.RedactError(err))}
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		req.SetBasicAuth(u.User.Username(), pw)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return unreachable(mgmtURL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("listing %s: the management API answered %s", what, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v); err != nil {
		return fmt.Errorf("listing %s: %w", what, err)
	}
	return nil
}

// discover groups the listed queues into families: a queue Q with Q.poison
// or Q.retry.<delay> beside it (the main queue first, the tiers by delay,
// the poison queue last).
func discover(listed map[string]mgmtQueue) []family {
	names := map[string]bool{}
	for n := range listed {
		names[n] = true
	}
	tiers := map[string][]string{}
	for n := range names {
		if i := strings.LastIndex(n, ".retry."); i > 0 && names[n[:i]] {
			tiers[n[:i]] = append(tiers[n[:i]], n)
		}
	}
	var heads []string
	for n := range names {
		if names[n+".poison"] || len(tiers[n]) > 0 {
			heads = append(heads, n)
		}
	}
	sort.Strings(heads)
	var out []family
	for _, h := range heads {
		f := family{name: h}
		f.queues = append(f.queues, member{h, "main"})
		ts := tiers[h]
		sort.Slice(ts, func(i, j int) bool { return tierDelay(h, ts[i]) < tierDelay(h, ts[j]) })
		for _, tq := range ts {
			f.queues = append(f.queues, member{tq, "tier " + strings.TrimPrefix(tq, h+".retry.")})
		}
		if names[h+".poison"] {
			f.queues = append(f.queues, member{h + ".poison", "poison"})
		}
		out = append(out, f)
	}
	return out
}

// tierDelay is the delay a tier queue's name gives, for ordering.
func tierDelay(head, tier string) time.Duration {
	d, err := time.ParseDuration(strings.TrimPrefix(tier, head+".retry."))
	if err != nil {
		return 1<<63 - 1
	}
	return d
}

// row reads one queue's counts with a passive declare, on a channel of its
// own (a missing queue closes it), each wait on the broker within
// callTimeout (amqpcall.Inspect). A queue the broker says is not there
// is Missing; any other failure — a broker that does not answer — is the
// error, not a queue shown missing.
func row(conn *amqp.Connection, family, queue, role string) (queueRow, error) {
	r := queueRow{Family: family, Queue: queue, Role: role}
	q, err := amqpcall.Inspect(context.Background(), conn, callTimeout, queue)
	var ae *amqp.Error
	switch {
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		r.Missing = true
		return r, nil
	case err != nil:
		return r, fmt.Errorf("reading queue %s: %w", diag.Printable(queue, 255), diag.RedactError(err))
	}
	r.Ready, r.Consumers = q.Messages, q.Consumers
	return r, nil
}

// oldestPoisoning reads the poison queue's head message and puts it back.
func oldestPoisoning(conn *amqp.Connection, queue string) time.Time {
	var at time.Time
	_, _ = dlq.Open(conn, queue, dlq.Config{}).Each(context.Background(), dlq.Filter{}, 1, func(m *dlq.Message) error {
		at = m.PoisonedAt
		return nil
	})
	return at
}

// parseTiers parses --tiers.
func parseTiers(tiers string) ([]time.Duration, error) {
	var delays []time.Duration
	for _, s := range strings.Split(tiers, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, usageError{fmt.Errorf("--tiers %q: %w", tiers, err)}
		}
		delays = append(delays, d)
	}
	return delays, nil
}

// unreachable describes a request to the management API that got no answer:
// the URL (its password replaced) and the cause, and for a refused
// connection the likeliest reason.
func unreachable(mgmtURL string, err error) error {
	cause := err
	if ue, ok := errors.AsType[*url.Error](err); ok && ue.Err != nil {
		cause = ue.Err // the Op and the URL are said here
	}
	hint := ""
	if errors.Is(err, syscall.ECONNREFUSED) {
		hint = "; is the rabbitmq_management plugin enabled (rabbitmq-plugins enable rabbitmq_management), and is that its port?"
	}
	return fmt.Errorf("cannot reach the management API at %s: %w%s", diag.RedactURL(mgmtURL), diag.RedactError(cause), hint)
}
