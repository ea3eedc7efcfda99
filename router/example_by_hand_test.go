package router_test

import (
	"context"
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// addStockByHand is the whole stack wired by hand (docs/architecture.md,
// "The stage-by-stage API"): every stage around a handler on RabbitMQ and
// PostgreSQL, in one router.Add. Close the broker it returns after the
// router. TestTheByHandStackRuns runs it.
func addStockByHand(ctx context.Context, r *message.Router, amqpURL string, db *sqlx.DB) (*rabbitmq.Broker, error) {
	stores, err := sluicesql.New(db, sluicesql.Config{}) // the inbox, the outbox, the replay outcomes
	if err != nil {
		return nil, err
	}
	if err := stores.Migrate(ctx); err != nil {
		return nil, err
	}
	q, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: amqpURL},
		Topology:   rabbitmq.TopologyConfig{Queue: "stock", Quorum: true, DeliveryLimit: 20},
	}) // declares stock, stock.retry.{30s,5m,30m}, stock.poison
	if err != nil {
		return nil, err
	}
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "stock",
		Handler: func(msg *message.Message) error {
			var order struct {
				OrderID string `json:"orderId"`
			}
			if err := json.Unmarshal(msg.Payload, &order); err != nil {
				return err // JSON of another shape: Poison (malformed JSON never gets here: the key is read first)
			}
			tx := sluicesql.TxFromContext(msg.Context()) // the inbox's transaction
			_, err := tx.ExecContext(msg.Context(), `INSERT INTO reservations (order_id) VALUES ($1)`, order.OrderID)
			return err // your table: create it first (a missing table is a bug, SQLSTATE 42: Poison)
		},
		Stages: router.Stages{
			Trace:     &stage.TraceConfig{},
			Replay:    &replay.Config{Store: stores.Outcomes, InUnitOfWork: true}, // "processed" in the inbox's transaction
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Brake:     &brake.Config{Match: brake.MatchUnreachable}, // probes with the inbox's Ping
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: stores.Inbox, Key: sluice.KeyFromJSON("eventId")},
			Recoverer: &stage.RecovererConfig{},
		},
	})
	return q, err
}

var _ = addStockByHand
