package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/sluicemq/sluice/cmd/internal/dlq"
	"github.com/sluicemq/sluice/internal/diag"
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
	var tiers, poisonQueue string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "The queue family of each consumer queue: main, retry tiers, poison; depth, consumers, oldest poisoning",
		Long: "For each --queue: the main queue, its retry tiers (--tiers, as the topology was declared)\n" +
			"and its poison queue, with the messages ready and the consumers the broker reports, and\n" +
			"for the poison queue the age of its oldest isolation (read from its head message, which\n" +
			"stays, marked redelivered). A queue that does not exist is reported missing. The main\n" +
			"and tier queues are not read. AMQP cannot list queues: name them (the management API's\n" +
			"listing is not used, so no plugin is needed).",
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if len(queues) == 0 {
				return usageError{errors.New("--queue is required (repeat it for several consumer queues)")}
			}
			delays, err := parseTiers(tiers)
			if err != nil {
				return err
			}
			conn, err := connect(g)
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close() }()
			var rows []queueRow
			for _, q := range queues {
				topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: q, TierDelays: delays, PoisonQueue: poisonQueue})
				if err != nil {
					return usageError{err}
				}
				rows = append(rows, row(conn, q, topo.Queue(), "main"))
				for _, t := range topo.Tiers() {
					rows = append(rows, row(conn, q, t.Topic, "tier "+t.Name))
				}
				p := row(conn, q, topo.PoisonQueue(), "poison")
				if !p.Missing && p.Ready > 0 {
					p.OldestPoisonedAt = oldestPoisoning(conn, topo.PoisonQueue())
				}
				rows = append(rows, p)
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
	return cmd
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
