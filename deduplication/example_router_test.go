package deduplication_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/deduplication/sqlstore/sqlite"
	"github.com/sluicemq/sluice/middleware"
)

// addInventory is the README's quick start: the inbox added to an existing
// Watermill router.
func addInventory(ctx context.Context, router *message.Router, sub message.Subscriber, db *sqlx.DB) error {
	store, err := sqlstore.New(sqlstore.Config{DB: db}) // PostgreSQL or SQLite
	if err != nil {
		return err
	}
	if err := store.CreateTable(ctx); err != nil {
		return err
	}
	classifier := sluice.DefaultClassifier()
	classify, err := middleware.Classify(middleware.ClassifyConfig{Classifier: classifier})
	if err != nil {
		return err
	}
	inbox, err := deduplication.New(deduplication.Config{
		Store:      store,
		Consumer:   "inventory",
		Key:        deduplication.KeyFromJSON("eventId"), // the business event id
		Classifier: classifier,
	})
	if err != nil {
		return err
	}
	recoverer, err := middleware.Recoverer(middleware.RecovererConfig{})
	if err != nil {
		return err
	}
	handler := deduplication.ReentryNoPublish(func(msg *message.Message) error {
		tx := sqlstore.TxFromContext(msg.Context()) // the inbox transaction
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO reservations (order_id) VALUES ('o-1')`)
		return err // nil: committed, then acked; an error: rolled back
	}) // runs once per inbox transaction, whatever retry middleware the router adds later
	router.AddConsumerHandler("inventory", "order.created", sub, handler).
		AddMiddleware(classify, inbox, recoverer)
	return nil
}

// The inbox on a Watermill router: three deliveries of one event, one
// reservation.
func Example_router() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, _ := os.MkdirTemp("", "sluice-example")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer func() { _ = db.Close() }()
	db.MustExec(`CREATE TABLE reservations (order_id TEXT NOT NULL)`)

	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	if err := addInventory(ctx, router, pubSub, db); err != nil {
		panic(err)
	}
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	for range 3 {
		_ = pubSub.Publish("order.created", message.NewMessage(watermill.NewUUID(), []byte(`{"eventId":"evt-1"}`)))
	}
	_ = router.Close() // waits for the handlers in flight
	_ = pubSub.Close()

	var n int
	_ = db.Get(&n, `SELECT count(*) FROM reservations`)
	fmt.Println("reservations:", n)
	// Output: reservations: 1
}
