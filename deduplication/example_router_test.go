package deduplication_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
	"github.com/sluicemq/sluice/unitofwork"
)

// addInventory is the README's quick start: the inbox added to an existing
// Watermill router that consumes RabbitMQ with watermill-amqp.
// TestTheREADMEQuickStartRuns runs it.
func addInventory(ctx context.Context, router *message.Router, amqpURL string, db *sqlx.DB, logger watermill.LoggerAdapter) error {
	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{}) // PostgreSQL or SQLite
	if err != nil {
		return err
	}
	if err := store.CreateTable(ctx); err != nil {
		return err
	}
	cfg, err := rabbitmq.WithMarshaler(amqp.NewDurableQueueConfig(amqpURL)) // your config, with Sluice's marshaler
	if err != nil {
		return err // a marshaler it cannot carry over, or Consume.NoRequeueOnNack: named
	}
	sub, err := amqp.NewSubscriber(cfg, logger) // watermill-amqp's, declaring what it declared before
	if err != nil {
		return err
	}
	classifier := sluice.DefaultClassifier()
	classify, err := stage.Classify(stage.ClassifyConfig{Env: sluice.Env{Classifier: classifier, Logger: logger}})
	if err != nil {
		return err
	}
	inbox, err := deduplication.New(deduplication.Config{
		Store:    store,
		Consumer: "inventory",                   // unique among the consumers sharing this table
		Key:      sluice.KeyFromJSON("eventId"), // the business event id
		Env:      sluice.Env{Classifier: classifier, Logger: logger},
	})
	if err != nil {
		return err
	}
	recoverer, err := stage.Recoverer(stage.RecovererConfig{})
	if err != nil {
		return err
	}
	handler := unitofwork.ReentryNoPublish(func(msg *message.Message) error {
		tx := sluicesql.TxFromContext(msg.Context()) // the inbox transaction
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO reservations (order_id) VALUES ('o-1')`)
		return err // nil: committed, then acked; an error: rolled back
	}) // runs once per inbox transaction, whatever retry middleware the router adds later
	router.AddConsumerHandler("inventory", "order.created", sub, handler).
		AddMiddleware(classify, inbox, recoverer)
	return nil
}
