package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"

	"github.com/sluicemq/sluice/sluicesql"
)

// summary is what the stores, the queues and Sluice's metrics recorded.
type summary struct {
	Published int
	Inventory handlerCounts
	Reserved  []string // order ids in the reservations table
	Rejected  []string // "order: reason" in the rejections table
	// RejectionEvents are delivered on the rejection topic or queue.
	RejectionEvents int
	Relayed         int64 // sluice.outbox.relayed
	OutboxRows      int64 // left in the outbox table
	OutboxTable     string
	OrderLog        handlerCounts
	Logged          []string // the event id of each row of the order_log table
	// Batches the order log committed, and the events they committed
	// (sluice.inbox.batch.size: its count and sum).
	Batches, Batched int64
	PendingRetries   int    // copies waiting in the tiers
	Note             string // what the mode does not promise
	Ready            string // the readiness report's status before closing (service.Ready, /readyz)

	metrics http.Handler // Prometheus, with --metrics-addr
}

// handlerCounts is what one handler's inbox, poison queue and metrics show.
type handlerCounts struct {
	Inbox      int              // its events in the inbox table
	Duplicates int64            // sluice.inbox.duplicates
	Retried    map[string]int64 // sluice.retries, by tier
	Poisoned   []poisonedRow    // read back from its poison queue
}

type poisonedRow struct{ Class, EventID, Reason string }

// handlerAttribute names a data point's handler: the consumer group
// (Prometheus: messaging_consumer_group_name).
const handlerAttribute = "messaging.consumer.group.name"

type metricReader interface {
	Collect(context.Context, *metricdata.ResourceMetrics) error
}

func summarize(ctx context.Context, e env, ob *sluicesql.Outbox, metrics metricReader) (*summary, error) {
	s := &summary{Published: len(script), OutboxTable: ob.Name()}
	byHandler := map[string]*handlerCounts{inventoryHandler: &s.Inventory, orderLogHandler: &s.OrderLog}
	t := e.tables()
	db := e.db()
	var inbox []struct {
		Consumer string `db:"consumer"`
		Events   int    `db:"events"`
	}
	if err := db.SelectContext(ctx, &inbox, `SELECT consumer, count(*) AS events FROM `+t.of("sluice_inbox")+` GROUP BY consumer`); err != nil {
		return nil, err
	}
	for _, row := range inbox {
		if h, ok := byHandler[row.Consumer]; ok {
			h.Inbox = row.Events
		}
	}
	if err := db.SelectContext(ctx, &s.Reserved, `SELECT order_id FROM `+t.of("reservations")+` ORDER BY order_id`); err != nil {
		return nil, err
	}
	if err := db.SelectContext(ctx, &s.Rejected, `SELECT order_id || ': ' || reason FROM `+t.of("rejections")+` ORDER BY order_id`); err != nil {
		return nil, err
	}
	if err := db.SelectContext(ctx, &s.Logged, `SELECT event_id FROM `+t.of("order_log")+` ORDER BY event_id`); err != nil {
		return nil, err
	}
	var err error
	if s.RejectionEvents, err = e.rejectionEvents(ctx); err != nil {
		return nil, err
	}
	if s.PendingRetries, err = e.pendingRetries(ctx); err != nil {
		return nil, err
	}
	left, err := ob.Stats(ctx)
	if err != nil {
		return nil, err
	}
	s.OutboxRows = left.Pending
	for name, h := range byHandler {
		poisoned, err := e.poisoned(ctx, name)
		if err != nil {
			return nil, err
		}
		for _, m := range poisoned {
			h.Poisoned = append(h.Poisoned, poisonedRow{m.Metadata.Get("sluice_poison_class"), m.Metadata.Get(sluice.EventIDKey), m.Metadata.Get("sluice_poison_reason")})
		}
		sort.Slice(h.Poisoned, func(i, j int) bool { return h.Poisoned[i].Class < h.Poisoned[j].Class })
		h.Retried = map[string]int64{}
	}

	var rm metricdata.ResourceMetrics
	if err := metrics.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					handler, _ := dp.Attributes.Value(handlerAttribute)
					h := byHandler[handler.AsString()]
					switch {
					case m.Name == "sluice.outbox.relayed":
						s.Relayed += dp.Value
					case h == nil: // no handler's: the producer's, the relay's
					case m.Name == "sluice.inbox.duplicates":
						h.Duplicates += dp.Value
					case m.Name == "sluice.retries":
						if tier, _ := dp.Attributes.Value("sluice.tier"); dp.Value != 0 { // exported at zero from the start
							h.Retried[tier.AsString()] += dp.Value
						}
					}
				}
			case metricdata.Histogram[int64]:
				if m.Name != "sluice.inbox.batch.size" {
					continue
				}
				for _, dp := range data.DataPoints {
					if handler, _ := dp.Attributes.Value(handlerAttribute); handler.AsString() == orderLogHandler {
						s.Batches += int64(dp.Count)
						s.Batched += dp.Sum
					}
				}
			}
		}
	}
	return s, nil
}

func (s *summary) print(w io.Writer) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(label string, n any, detail string) { fmt.Fprintf(tw, "%s\t%v\t%s\n", label, n, detail) }
	row("deliveries published", s.Published, "each to both handlers' queues")
	row("inventory", "", "a PublishingHandler: reads stock and decides, per event")
	row("  reserved once (reservations table)", len(s.Reserved), strings.Join(s.Reserved, " "))
	row("  rejected: committed and acked", len(s.Rejected), fmt.Sprintf("%s; rejection events delivered: %d", strings.Join(s.Rejected, ", "), s.RejectionEvents))
	row("  outbox: relayed (sluice.outbox.relayed)", s.Relayed, "the rejection event: committed with its claim, then published")
	row("  outbox: rows left in the table", s.OutboxRows, s.OutboxTable)
	s.Inventory.print(row)
	row("order log", "", "a BatchHandler: a row per event, one INSERT per batch")
	events := map[string]bool{}
	for _, id := range s.Logged {
		events[id] = true
	}
	once := "each event once"
	if len(events) != len(s.Logged) {
		once = fmt.Sprintf("%d events: some logged more than once", len(events))
	}
	row("  rows (order_log table)", len(s.Logged), strings.Join(s.Logged, " ")+": "+once)
	row("  batches committed (sluice.inbox.batch.size)", s.Batches, fmt.Sprintf("%d events in all", s.Batched))
	s.OrderLog.print(row)
	row("readiness before closing (/readyz)", "", s.Ready)
	_ = tw.Flush()
	for line := range strings.Lines(b.String()) { // a row without detail ends in its padding
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
	if s.Note != "" {
		fmt.Fprintf(w, "\n%s\n", s.Note)
	}
}

// print prints the rows every handler has: its inbox, duplicates, retries
// and poison queue.
func (h handlerCounts) print(row func(label string, n any, detail string)) {
	row("  events in the inbox", h.Inbox, "")
	row("  duplicates skipped (sluice.inbox.duplicates)", h.Duplicates, "")
	tiers := make([]string, 0, len(h.Retried))
	for t := range h.Retried {
		tiers = append(tiers, t)
	}
	sort.Strings(tiers)
	for _, t := range tiers {
		row("  retried via tier "+t+" (sluice.retries)", h.Retried[t], "")
	}
	row("  poisoned (poison queue)", len(h.Poisoned), "")
	for _, p := range h.Poisoned {
		row("    "+p.Class, "", cmp.Or(p.EventID, "-")+"\t"+p.Reason)
	}
}
