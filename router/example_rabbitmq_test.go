package router_test

import (
	"context"
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	replaysql "github.com/sluicemq/sluice/replay/sqlstore"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
)

// addReliableInventory is the README's second quick start: the whole stack
// around a handler on RabbitMQ and PostgreSQL, in one call. Close the
// broker it returns after the router. TestTheREADMEStackRuns runs it.
func addReliableInventory(ctx context.Context, r *message.Router, amqpURL string, db *sqlx.DB) (*rabbitmq.Broker, error) {
	store, err := sqlstore.New(sqlstore.Config{DB: db})
	if err != nil {
		return nil, err
	}
	if err := store.CreateTable(ctx); err != nil {
		return nil, err
	}
	outcomes, err := replaysql.New(replaysql.Config{DB: db}) // what became of each replayed message: sluice dlq replay --outcomes, dlq report
	if err != nil {
		return nil, err
	}
	if err := outcomes.CreateTable(ctx); err != nil {
		return nil, err
	}
	q, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: amqpURL},
		Topology:   rabbitmq.TopologyConfig{Queue: "inventory", Quorum: true, DeliveryLimit: 20},
	}) // declares inventory, inventory.retry.{30s,5m,30m}, inventory.poison
	if err != nil {
		return nil, err
	}
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "inventory",
		Handler: func(msg *message.Message) error {
			var order struct {
				OrderID string `json:"orderId"`
			}
			if err := json.Unmarshal(msg.Payload, &order); err != nil {
				return err // malformed JSON: Poison, isolated with its reason
			}
			tx := sqlstore.TxFromContext(msg.Context()) // the inbox's transaction
			_, err := tx.ExecContext(msg.Context(), `INSERT INTO reservations (order_id) VALUES ($1)`, order.OrderID)
			return err // your table: create it first (a missing table is a bug, SQLSTATE 42: Poison)
		},
		Stages: router.Stages{
			Trace:     &middleware.TraceConfig{},
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &middleware.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: store, Consumer: "inventory", Key: deduplication.KeyFromJSON("eventId")},
			Replay:    &replay.Config{Store: outcomes, InUnitOfWork: true}, // "processed" in the inbox's transaction
			Recoverer: &middleware.RecovererConfig{},
		},
	})
	return q, err
}

var _ = addReliableInventory
