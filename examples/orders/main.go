// Command orders is Sluice's bundled example: an inventory service that
// reserves stock for order.created events, on the embedded default (Watermill's
// GoChannel and SQLite, no servers):
//
//	make run          # or: go run ./examples/orders
//
// A producer publishes a scripted mix — new orders, duplicate deliveries of the
// same eventId, a stock service that times out once, an order for a product
// out of stock — and the example prints what the database recorded.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/middleware"
)

const topic = "order.created"

func main() {
	dbPath := flag.String("db", "", "SQLite file (default: a new file in a temporary directory)")
	flag.Parse()
	if err := runAndPrint(*dbPath); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func runAndPrint(dbPath string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := run(ctx, dbPath)
	if err != nil {
		return err
	}
	s.print(os.Stdout)
	return nil
}

// delivery is one publish of the script.
type delivery struct {
	eventID, orderID, sku string
	qty                   int
	note                  string
}

// script: 5 orders, 2 of them delivered again (same eventId), one that meets
// a stock-service timeout first, one for a product out of stock.
var script = []delivery{
	{"evt-1", "o-1", "book", 1, "new order"},
	{"evt-2", "o-2", "book", 2, "new order"},
	{"evt-1", "o-1", "book", 1, "duplicate delivery of evt-1"},
	{"evt-3", "o-3", "lamp", 1, "stock service times out on the first try"},
	{"evt-4", "o-4", "piano", 1, "out of stock: rejected"},
	{"evt-2", "o-2", "book", 2, "duplicate delivery of evt-2"},
	{"evt-5", "o-5", "lamp", 2, "new order"},
}

func run(ctx context.Context, dbPath string) (*summary, error) {
	if dbPath == "" {
		dir, err := os.MkdirTemp("", "sluice-orders")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		dbPath = filepath.Join(dir, "orders.db")
	}
	db, err := deduplication.OpenSQLite(ctx, dbPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }()
	svc, err := newInventory(ctx, db)
	if err != nil {
		return nil, err
	}

	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	defer func() { _ = pubSub.Close() }()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	stack, err := svc.middlewares()
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("inventory", topic, pubSub, svc.reserve).AddMiddleware(stack...)

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	<-router.Running()

	// Publish returns once the delivery is acked (BlockPublishUntilSubscriberAck),
	// so the script plays in order, redeliveries of a nacked message included.
	for _, d := range script {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"orderId":%q,"sku":%q,"qty":%d}`, d.orderID, d.sku, d.qty))
		msg.Metadata.Set(middleware.EventIDKey, d.eventID)
		if err := pubSub.Publish(topic, msg); err != nil {
			return nil, err
		}
	}
	// Wait until every distinct event is in the inbox, then stop the router:
	// Close waits for the handlers in flight.
	if err := svc.waitProcessed(ctx, distinctEvents()); err != nil {
		return nil, err
	}
	if err := router.Close(); err != nil {
		return nil, err
	}
	if err := <-routerDone; err != nil {
		return nil, err
	}
	return svc.summarize(ctx)
}

func distinctEvents() int {
	seen := map[string]bool{}
	for _, d := range script {
		seen[d.eventID] = true
	}
	return len(seen)
}

func (svc *inventory) waitProcessed(ctx context.Context, n int) error {
	for {
		var got int
		if err := svc.db.GetContext(ctx, &got, `SELECT count(*) FROM sluice_inbox`); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d events in the inbox, %d so far: %w", n, got, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
