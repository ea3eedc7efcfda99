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
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/localenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// queueRow is one queue of a family in `sluice queues`.
type queueRow struct {
	Family    string `json:"family"`
	Queue     string `json:"queue"`
	Role      string `json:"role"` // main, tier <delay>, poison
	Ready     int    `json:"ready"`
	Consumers int    `json:"consumers"`
	Missing   bool   `json:"missing,omitempty"`
	// OldestPoisonedAt is, for a poison queue, its head message's
	// sluice_poisoned_at: the oldest isolation (the queue is FIFO).
	OldestPoisonedAt time.Time `json:"oldest_poisoned_at,omitzero"`
}

func newQueues(g *globals, out io.Writer) *cobra.Command {
	var queues []string
	var tiers, poisonQueue, mgmtURL string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "The queue family of each consumer queue: main, retry tiers, poison; depth, consumers, oldest poisoning",
		Long: "For each --queue: the main queue, its retry tiers (--tiers, as the topology was declared)\n" +
			"and its poison queue, with the messages ready and the consumers the broker reports, and\n" +
			"for the poison queue the age of its oldest isolation (read from its head message, which\n" +
			"stays, marked redelivered). A queue that does not exist is reported missing. The main\n" +
			"and tier queues are not read. AMQP cannot list queues: name them with --queue, or give\n" +
			"--management-url (RabbitMQ's management API; the credentials and vhost are the AMQP\n" +
			"URL's) to list every family the broker has: a queue Q with Q.poison or Q.retry.* beside it.",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if len(queues) == 0 && mgmtURL == "" {
				return usageError{errors.New("--queue or --management-url is required")}
			}
			delays, err := parseTiers(tiers)
			if err != nil {
				return err
			}
			var fams []family // named, or listed by the management API
			if len(queues) == 0 {
				if fams, err = discover(mgmtURL, g.url()); err != nil {
					return err
				}
			}
			for _, q := range queues {
				topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: q, TierDelays: delays, PoisonQueue: poisonQueue})
				if err != nil {
					return usageError{err}
				}
				f := family{name: q, queues: []member{{topo.Queue(), "main"}}}
				for _, t := range topo.Tiers() {
					f.queues = append(f.queues, member{t.Topic, "tier " + t.Name})
				}
				f.queues = append(f.queues, member{topo.PoisonQueue(), "poison"})
				fams = append(fams, f)
			}
			conn, err := connect(g)
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close() }()
			var rows []queueRow
			for _, f := range fams {
				for _, m := range f.queues {
					r := row(conn, f.name, m.name, m.role)
					if r.Role == "poison" && !r.Missing && r.Ready > 0 {
						r.OldestPoisonedAt = oldestPoisoning(conn, r.Queue)
					}
					rows = append(rows, r)
				}
			}
			if asJSON {
				enc := json.NewEncoder(out)
				for _, r := range rows {
					if err := enc.Encode(r); err != nil {
						return err
					}
				}
				return nil
			}
			t := table.NewWriter()
			t.SetOutputMirror(out)
			t.SetStyle(table.StyleLight)
			t.AppendHeader(table.Row{"queue", "role", "ready", "consumers", "oldest poisoning"})
			for _, r := range rows {
				ready, consumers, oldest := fmt.Sprint(r.Ready), fmt.Sprint(r.Consumers), "-"
				if r.Missing {
					ready, consumers = "missing", "-"
				}
				if !r.OldestPoisonedAt.IsZero() {
					oldest = time.Since(r.OldestPoisonedAt).Round(time.Second).String() + " ago"
				}
				t.AppendRow(table.Row{diag.Printable(r.Queue, 255), r.Role, ready, consumers, oldest})
			}
			t.Render()
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&queues, "queue", nil, "a consumer queue (repeatable)")
	fl.StringVar(&tiers, "tiers", "30s,5m,30m", "the retry tier delays the topology was declared with")
	fl.StringVar(&poisonQueue, "poison-queue", "", "the poison queue (default <queue>.poison)")
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

// discover lists the broker's queues through the management API and groups
// them into families: a queue Q with Q.poison or Q.retry.<delay> beside it
// (the main queue first, the tiers by delay, the poison queue last).
func discover(mgmtURL, amqpURL string) ([]family, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return nil, errors.New("the AMQP URL does not parse (not shown: it may hold a password)")
	}
	vhost := "/"
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		vhost, _ = url.PathUnescape(p)
	}
	api := strings.TrimSuffix(mgmtURL, "/") + "/api/queues/" + url.PathEscape(vhost) + "?columns=name"
	req, err := http.NewRequest(http.MethodGet, api, nil)
	if err != nil {
		return nil, usageError{fmt.Errorf("--management-url: %w", diag.RedactError(err))}
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		req.SetBasicAuth(u.User.Username(), pw)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("listing the queues: %w", diag.RedactError(err))
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("listing the queues: the management API answered %s", resp.Status)
	}
	var listed []struct {
		Name string `json:"name"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&listed); err != nil {
		return nil, fmt.Errorf("listing the queues: %w", err)
	}
	names := map[string]bool{}
	for _, q := range listed {
		names[q.Name] = true
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
	return out, nil
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
// own (a missing queue closes it).
func row(conn *amqp.Connection, family, queue, role string) queueRow {
	r := queueRow{Family: family, Queue: queue, Role: role}
	ch, err := conn.Channel()
	if err != nil {
		r.Missing = true
		return r
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		r.Missing = true
		return r
	}
	r.Ready, r.Consumers = q.Messages, q.Consumers
	return r
}

// oldestPoisoning reads the poison queue's head message and puts it back.
func oldestPoisoning(conn *amqp.Connection, queue string) time.Time {
	var at time.Time
	_, _ = dlq.Scan(context.Background(), conn, queue, func(m *dlq.Message) (bool, error) {
		at = m.PoisonedAt
		return true, nil
	}, nil)
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
