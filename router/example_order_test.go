package router_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// An ordered handler (docs/ordering.md): each account's events apply in
// publish order through retries; the other accounts flow while one waits.
// TestOrderPerKeyThroughRetries runs it on RabbitMQ and PostgreSQL.
func ExampleStages_order() {
	var (
		ctx            = context.Background()
		db             *sqlx.DB        // the inbox's PostgreSQL database
		b              broker.Broker   // rabbitmq.NewBroker: its queue consumed by one consumer
		r              *message.Router // the service's router
		inbox          deduplication.Store
		applyToAccount func(*message.Message) error
	)
	// Not run (no Output): the values above are the service's.
	stores, err := sluicesql.New(db, sluicesql.Config{}) // the inbox's database
	err = stores.Migrate(ctx)                            // the ordering store's tables among Sluice's
	orders := stores.Order                               // sluicesql.NewOrders(db, …) alone

	_, err = router.Add(r, router.HandlerConfig{
		Broker:  b, // its queue consumed by one consumer (see "Topology")
		Name:    "ledger",
		Handler: applyToAccount,
		Stages: router.Stages{
			Order:  &ordering.Config{Store: orders, Key: sluice.KeyFromMetadata("account")},
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Inbox: &deduplication.Config{Store: inbox},
		},
	})
	_ = err
}
