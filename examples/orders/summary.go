package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/outbox"
	outboxsql "github.com/sluicemq/sluice/outbox/sqlstore"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
)

// summary is what the stores, the queues and Sluice's metrics recorded.
type summary struct {
	Published       int
	InboxRecords    int
	Reserved        []string // order ids in the reservations table
	Rejected        []string // "order: reason" in the rejections table
	RejectionEvents int      // delivered on the rejection topic or queue
	Relayed         int64    // sluice.outbox.relayed
	OutboxRows      int64    // left in the outbox table
	OutboxTable     string
	Duplicates      int64 // sluice.inbox.duplicates
	RetriedByTier   map[string]int64
	Poisoned        []poisonedRow // read back from the poison queue
	Note            string        // what the mode does not promise
	Ready           string        // the readiness report's status before closing (service.Ready, /readyz)

	metrics http.Handler // Prometheus, with --metrics-addr
}

type poisonedRow struct{ Class, EventID, Reason string }

func summarize(ctx context.Context, e env, ob *outboxsql.Store, metrics interface {
	Collect(context.Context, *metricdata.ResourceMetrics) error
}) (*summary, error) {
	s := &summary{Published: len(script), RetriedByTier: map[string]int64{}, OutboxTable: ob.Name()}
	t := e.tables()
	db := e.db()
	if err := db.GetContext(ctx, &s.InboxRecords, `SELECT count(*) FROM `+t.of("sluice_inbox")); err != nil {
		return nil, err
	}
	if err := db.SelectContext(ctx, &s.Reserved, `SELECT order_id FROM `+t.of("reservations")+` ORDER BY order_id`); err != nil {
		return nil, err
	}
	if err := db.SelectContext(ctx, &s.Rejected, `SELECT order_id || ': ' || reason FROM `+t.of("rejections")+` ORDER BY order_id`); err != nil {
		return nil, err
	}
	var err error
	if s.RejectionEvents, err = e.rejectionEvents(ctx); err != nil {
		return nil, err
	}
	left, err := ob.Stats(ctx)
	if err != nil {
		return nil, err
	}
	s.OutboxRows = left.Pending
	poisoned, err := e.poisoned(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range poisoned {
		s.Poisoned = append(s.Poisoned, poisonedRow{m.Metadata.Get(poison.ClassKey), m.Metadata.Get(sluice.EventIDKey), m.Metadata.Get(poison.ReasonKey)})
	}
	sort.Slice(s.Poisoned, func(i, j int) bool { return s.Poisoned[i].Class < s.Poisoned[j].Class })

	var rm metricdata.ResourceMetrics
	if err := metrics.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				switch m.Name {
				case deduplication.MetricDuplicates:
					s.Duplicates += dp.Value
				case retrytiers.MetricRetries:
					tier, _ := dp.Attributes.Value("sluice.tier")
					s.RetriedByTier[tier.AsString()] += dp.Value
				case outbox.MetricRelayed:
					s.Relayed += dp.Value
				}
			}
		}
	}
	return s, nil
}

func (s *summary) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "deliveries published\t%d\n", s.Published)
	fmt.Fprintf(tw, "reserved once (reservations table)\t%d\t%s\n", len(s.Reserved), strings.Join(s.Reserved, " "))
	fmt.Fprintf(tw, "rejected: committed and acked\t%d\t%s; rejection events delivered: %d\n", len(s.Rejected), strings.Join(s.Rejected, ", "), s.RejectionEvents)
	fmt.Fprintf(tw, "outbox: relayed (sluice.outbox.relayed)\t%d\tthe rejection event: committed with its claim, then published\n", s.Relayed)
	fmt.Fprintf(tw, "outbox: rows left in the table\t%d\t%s\n", s.OutboxRows, s.OutboxTable)
	fmt.Fprintf(tw, "events in the inbox\t%d\n", s.InboxRecords)
	fmt.Fprintf(tw, "duplicates skipped (sluice.inbox.duplicates)\t%d\n", s.Duplicates)
	tiers := make([]string, 0, len(s.RetriedByTier))
	for t := range s.RetriedByTier {
		tiers = append(tiers, t)
	}
	sort.Strings(tiers)
	for _, t := range tiers {
		fmt.Fprintf(tw, "retried via tier %s (sluice.retries)\t%d\n", t, s.RetriedByTier[t])
	}
	fmt.Fprintf(tw, "readiness before closing (/readyz)\t%s\n", s.Ready)
	fmt.Fprintf(tw, "poisoned (poison queue)\t%d\n", len(s.Poisoned))
	for _, p := range s.Poisoned {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Class, p.EventID, p.Reason)
	}
	_ = tw.Flush()
	if s.Note != "" {
		fmt.Fprintf(w, "\n%s\n", s.Note)
	}
}
