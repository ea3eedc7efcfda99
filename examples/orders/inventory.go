package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/middleware"
)

var errOutOfStock = errors.New("out of stock")

// inventory reserves stock; every write goes into the inbox transaction.
type inventory struct {
	db      *sqlx.DB
	metrics *sdkmetric.ManualReader

	mu       sync.Mutex
	timedOut map[string]bool // orders whose first stock check timed out
}

func newInventory(ctx context.Context, db *sqlx.DB) (*inventory, error) {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS reservations (order_id TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS rejections (order_id TEXT NOT NULL, reason TEXT NOT NULL)`,
		`INSERT INTO stock (sku, available) VALUES ('book', 10), ('lamp', 5), ('piano', 0) ON CONFLICT DO NOTHING`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, err
		}
	}
	return &inventory{db: db, metrics: sdkmetric.NewManualReader(), timedOut: map[string]bool{}}, nil
}

// middlewares returns the stages, outermost first: classify → inbox → recoverer.
func (svc *inventory) middlewares() ([]message.HandlerMiddleware, error) {
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(svc.metrics))
	classifier := middleware.DefaultClassifier()
	classify, err := middleware.Classify(middleware.ClassifyConfig{Classifier: classifier, MeterProvider: meter})
	if err != nil {
		return nil, err
	}
	store, err := deduplication.NewSQLStore(deduplication.SQLConfig{DB: svc.db})
	if err != nil {
		return nil, err
	}
	if err := store.CreateTable(context.Background()); err != nil {
		return nil, err
	}
	inbox, err := deduplication.New(deduplication.Config{Store: store, Consumer: "inventory", Classifier: classifier, MeterProvider: meter})
	if err != nil {
		return nil, err
	}
	recoverer, err := middleware.Recoverer(middleware.RecovererConfig{})
	if err != nil {
		return nil, err
	}
	return []message.HandlerMiddleware{classify, inbox.Middleware, recoverer}, nil
}

type orderCreated struct {
	OrderID string `json:"orderId"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

func (svc *inventory) reserve(msg *message.Message) error {
	var o orderCreated
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return err // a syntax error is classified Poison
	}
	ctx := msg.Context()
	tx := deduplication.TxFromContext(ctx)
	if o.OrderID == "o-3" && svc.firstTry(o.OrderID) {
		return fmt.Errorf("stock service: %w", context.DeadlineExceeded) // Transient: redelivered
	}
	var available int
	if err := tx.GetContext(ctx, &available, `SELECT available FROM stock WHERE sku = ?`, o.SKU); err != nil {
		return err
	}
	if available < o.Qty {
		if _, err := tx.ExecContext(ctx, `INSERT INTO rejections (order_id, reason) VALUES (?, ?)`, o.OrderID, errOutOfStock.Error()); err != nil {
			return err
		}
		return middleware.Reject(fmt.Errorf("order %s: %w", o.OrderID, errOutOfStock))
	}
	if _, err := tx.ExecContext(ctx, `UPDATE stock SET available = available - ? WHERE sku = ?`, o.Qty, o.SKU); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO reservations (order_id, sku, qty) VALUES (?, ?, ?)`, o.OrderID, o.SKU, o.Qty)
	return err
}

func (svc *inventory) firstTry(orderID string) bool {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	first := !svc.timedOut[orderID]
	svc.timedOut[orderID] = true
	return first
}

// summary is what the database and Sluice's metrics recorded.
type summary struct {
	Reserved   []string // order ids with a reservation, once each if all is well
	Rejected   []string
	InboxRows  int
	Duplicates int64
	Published  int
}

func (svc *inventory) summarize(ctx context.Context) (*summary, error) {
	s := &summary{Published: len(script)}
	if err := svc.db.SelectContext(ctx, &s.Reserved, `SELECT order_id FROM reservations ORDER BY order_id`); err != nil {
		return nil, err
	}
	if err := svc.db.SelectContext(ctx, &s.Rejected, `SELECT order_id FROM rejections ORDER BY order_id`); err != nil {
		return nil, err
	}
	if err := svc.db.GetContext(ctx, &s.InboxRows, `SELECT count(*) FROM sluice_inbox`); err != nil {
		return nil, err
	}
	var rm metricdata.ResourceMetrics
	if err := svc.metrics.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == deduplication.MetricDuplicates {
				for _, dp := range sum.DataPoints {
					s.Duplicates += dp.Value
				}
			}
		}
	}
	return s, nil
}

func (s *summary) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "deliveries published\t%d\n", s.Published)
	fmt.Fprintf(tw, "events in the inbox\t%d\n", s.InboxRows)
	fmt.Fprintf(tw, "reserved (reservations table)\t%d\t%v\n", len(s.Reserved), s.Reserved)
	fmt.Fprintf(tw, "rejected, committed and acked\t%d\t%v\n", len(s.Rejected), s.Rejected)
	fmt.Fprintf(tw, "duplicates skipped (sluice.inbox.duplicates)\t%d\n", s.Duplicates)
	_ = tw.Flush()
}
