package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/promexport"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicesql"
)

// newInventory is the README's short path: a production service on r,
// RabbitMQ and PostgreSQL, its metrics and health served on mux.
// TestTheREADMEServiceRuns runs it.
func newInventory(ctx context.Context, r *message.Router, amqpURL string, db *sqlx.DB, mux *http.ServeMux) (*service.Service, *rabbitmq.Broker, error) {
	metrics, err := promexport.New(promexport.Config{}) // an OpenTelemetry MeterProvider Prometheus scrapes
	if err != nil {
		return nil, nil, err
	}
	q, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: amqpURL},
		Topology:   rabbitmq.TopologyConfig{Queue: "inventory", Quorum: true, DeliveryLimit: 20},
	}) // declares inventory, inventory.retry.{30s,5m,30m}, inventory.poison
	if err != nil {
		return nil, nil, err
	}
	svc, err := service.New(service.Config{
		DB:        db,
		Schema:    "inventory", // this service's own: Sluice's tables of two services never mix
		Router:    r,
		Publisher: q.Publisher(),
		Env:       sluice.Env{MeterProvider: metrics},
	})
	if err == nil {
		err = svc.Stores().Migrate(ctx) // schema inventory, its inbox, outbox and replay outcomes: created if missing
	}
	if err == nil {
		err = svc.Add(service.Handler{
			Broker:            q,
			Name:              "inventory",
			Key:               sluice.KeyFromJSON("eventId"), // the business event id
			PublishingHandler: reserve,
			PublishTopic:      "inventory.reserved",
			GroupCommit:       true, // deliveries in flight share a commit
		})
	}
	if err != nil {
		return nil, nil, errors.Join(err, q.Close())
	}
	mux.Handle("/metrics", metrics)
	mux.Handle("/livez", svc.Health())  // liveness: 503 only where a restart helps
	mux.Handle("/readyz", svc.Health()) // readiness: handler running, brake released, database, relay
	return svc, q, nil
}

// reserve runs once per event, inside the inbox's transaction; what it
// returns is written in the same transaction and published after the commit.
func reserve(msg *message.Message) ([]*message.Message, error) {
	var order struct {
		OrderID string `json:"orderId"`
	}
	if err := json.Unmarshal(msg.Payload, &order); err != nil {
		return nil, err // JSON of another shape ("orderId": 5): Poison, isolated in inventory.poison
	}
	tx := sluicesql.TxFromContext(msg.Context()) // the inbox's transaction
	if _, err := tx.ExecContext(msg.Context(), `INSERT INTO reservations (order_id) VALUES ($1)`, order.OrderID); err != nil {
		return nil, err // your table: a missing one is a bug (SQLSTATE 42): Poison
	}
	payload, err := json.Marshal(map[string]string{"orderId": order.OrderID})
	if err != nil {
		return nil, err
	}
	return []*message.Message{message.NewMessage(watermill.NewUUID(), payload)}, nil
}
