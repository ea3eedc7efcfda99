package deduplication_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/sqlite"
)

// The inbox on the embedded SQLite default: the business write and the inbox
// record share one transaction, and a redelivery of the same event id does not
// run the handler again.
func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sluice-example")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer func() { _ = db.Close() }()
	db.MustExec(`CREATE TABLE reservations (order_id TEXT NOT NULL)`)

	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{})
	if err != nil {
		panic(err)
	}
	if err := store.CreateTable(ctx); err != nil {
		panic(err)
	}
	inbox, err := deduplication.New(deduplication.Config{
		Store:    store,
		Consumer: "inventory",
		Key:      sluice.KeyFromJSON("eventId"),
	})
	if err != nil {
		panic(err)
	}

	reserve := inbox(func(msg *message.Message) ([]*message.Message, error) {
		tx := sluicesql.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO reservations (order_id) VALUES ('o-1')`)
		return nil, err
	})

	payload := []byte(`{"eventId":"evt-1","orderId":"o-1"}`)
	for range 3 { // the broker delivers the same event three times
		if _, err := reserve(message.NewMessage(watermill.NewUUID(), payload)); err != nil {
			panic(err)
		}
	}
	var n int
	_ = db.Get(&n, `SELECT count(*) FROM reservations`)
	fmt.Println("reservations:", n)

	_, err = reserve(message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-2"}`)))
	fmt.Println("class:", sluice.ClassOf(err))
	fmt.Println(err)
	// Output:
	// reservations: 1
	// class: poison
	// poison: deduplication key: JSON field "eventId": missing
}

// Configuring the SQL store and its pruner (compiled, not run: it needs a
// database).
func ExampleNewPruner() {
	var db *sqlx.DB                                             // sqlx.Connect("postgres", dsn)
	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{ // db: *sqlx.DB; its driver picks the dialect
		Table: "inventory.inbox", // default "sluice_inbox"; schema.name on PostgreSQL
	})
	if err != nil {
		panic(err)
	}
	p, err := sluicesql.NewPruner(sluicesql.PrunerConfig{
		Store:        store,
		Retention:    7 * 24 * time.Hour,
		RetryDelays:  []time.Duration{30 * time.Second, 5 * time.Minute, 30 * time.Minute},
		ReplayWindow: 3 * 24 * time.Hour,
	})
	if err != nil {
		panic(err)
	}
	if err := p.Start(context.Background()); err != nil {
		panic(err)
	}
	defer func() { _ = p.Close() }()
}
