package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/sluicesql/sqlite"
)

// A handler that reserves stock and produces a reservation event: the event
// is a row of the inbox's commit, relayed after it. Two deliveries of one
// order, one reservation, one event. On the embedded default (SQLite, the
// in-process broker); on RabbitMQ + PostgreSQL the relay's Publisher is the
// broker's confirmed one.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sluice-outbox-example")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer func() { _ = db.Close() }()
	db.MustExec(`CREATE TABLE reservations (order_id TEXT NOT NULL)`)
	stores, err := sluicesql.New(db, sluicesql.Config{}) // the inbox and the outbox on one database: one commit
	if err != nil {
		panic(err)
	}
	if err := stores.Migrate(ctx); err != nil {
		panic(err)
	}
	inboxStore, outboxStore := stores.Inbox, stores.Outbox
	b, err := embedded.New(embedded.Config{Topic: "order.created"})
	if err != nil {
		panic(err)
	}
	defer func() { _ = b.Close() }()
	reserved, err := b.PubSub().Subscribe(ctx, "inventory.reserved")
	if err != nil {
		panic(err)
	}

	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b,
		Name:   "inventory",
		PublishingHandler: func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			tx := sluicesql.TxFromContext(ctx) // the inbox's transaction
			if _, err := tx.ExecContext(ctx, `INSERT INTO reservations (order_id) VALUES ('o-1')`); err != nil {
				return nil, err
			}
			evt := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-1"}`))
			evt.Metadata.Set(sluice.EventIDKey, "reserved:o-1") // stable: a resent copy is a duplicate downstream
			// Written in the inbox's transaction, relayed after its commit.
			return []*message.Message{evt}, nil
		},
		PublishTopic: "inventory.reserved",
		Outbox:       outboxStore,
		Stages: router.Stages{
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: inboxStore, Key: sluice.KeyFromJSON("eventId")},
			Recoverer: &stage.RecovererConfig{},
		},
	})
	if err != nil {
		panic(err)
	}
	relay, err := outbox.NewRelay(outboxStore, b.PubSub().Publisher(), outbox.RelayConfig{})
	if err != nil {
		panic(err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()
	go func() { _ = r.Run(ctx) }()
	<-r.Running()

	for range 2 { // the same event delivered twice
		order := message.NewMessage(watermill.NewUUID(), []byte(`{"eventId":"evt-1","orderId":"o-1"}`))
		if err := b.PubSub().Publish("order.created", order); err != nil {
			panic(err)
		}
	}
	evt := <-reserved
	evt.Ack()
	fmt.Println("received", evt.Metadata.Get(sluice.EventIDKey), string(evt.Payload))

	_ = r.Close()
	if err := errors.Join(relay.Close(), <-relayDone); err != nil {
		panic(err)
	}
	var reservations, waiting int
	_ = db.Get(&reservations, `SELECT count(*) FROM reservations`)
	_ = db.Get(&waiting, `SELECT count(*) FROM sluice_outbox`)
	fmt.Println("reservations:", reservations, "rows left in the outbox:", waiting)
	// Output:
	// received reserved:o-1 {"orderId":"o-1"}
	// reservations: 1 rows left in the outbox: 0
}
