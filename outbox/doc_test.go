package outbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// addInventory is docs/outbox.md's first snippet: a publishing handler
// whose messages go through the outbox, and its relay.
func addInventory(ctx context.Context, r *message.Router, q *rabbitmq.Broker, db *sqlx.DB, inboxStore *sluicesql.Inbox, reserve message.HandlerFunc) (stop func() error, err error) {
	stores, err := sluicesql.New(db, sluicesql.Config{}) // the inbox's database
	if err != nil {
		return nil, err
	}
	if err := stores.Migrate(ctx); err != nil { // the outbox table, beside the inbox's
		return nil, err
	}
	outboxStore := stores.Outbox
	_, err = router.Add(r, router.HandlerConfig{
		Broker:            q,
		Name:              "inventory",
		PublishingHandler: reserve, // returns the events it produces
		PublishTopic:      "inventory.reserved",
		Outbox:            outboxStore, // instead of Publisher
		Stages: router.Stages{
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: inboxStore},
			Recoverer: &stage.RecovererConfig{},
		},
	})
	if err != nil {
		return nil, err
	}
	relay, err := outbox.NewRelay(outboxStore, q.Publisher(), outbox.RelayConfig{})
	if err != nil {
		return nil, err
	}
	go func() { _ = relay.Run(ctx) }()
	return relay.Close, nil // Close finishes the batch in flight
}

// reserve is docs/outbox.md's second snippet: a handler that writes what it
// produces itself.
func reserve(outboxStore *sluicesql.Outbox) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx := sluicesql.TxFromContext(ctx) // the inbox's transaction
		if _, err := tx.ExecContext(ctx, `INSERT INTO reservations (order_id) VALUES ('o-1')`); err != nil {
			return err
		}
		evt := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-1"}`))
		return outboxStore.Publish(ctx, "inventory.reserved", evt) // a row of the same commit
	}
}

// createOrder is docs/outbox.md's third snippet: a service that produces
// without consuming.
func createOrder(ctx context.Context, db *sqlx.DB, outboxStore *sluicesql.Outbox, evt *message.Message) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (order_id) VALUES ('o-1')`); err != nil {
		return err
	}
	if err := outboxStore.Write(ctx, tx, "orders.created", evt); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	outboxStore.Wake() // or the relay finds the rows within its PollInterval
	return nil
}

// The docs' snippets do what docs/outbox.md says (the first one is the
// Example's assembly on RabbitMQ; it is compiled here).
func TestTheDocsSnippetsWriteTheirRows(t *testing.T) {
	t.Parallel()
	_ = addInventory
	db := testenv.SQLite(t)
	db.MustExec(`CREATE TABLE reservations (order_id TEXT NOT NULL); CREATE TABLE orders (order_id TEXT NOT NULL)`)
	inboxStore := testenv.SQLStore(t, db, "sluice_inbox")
	outboxStore := testenv.Migrate(t, db, sluicesql.Config{}).Outbox
	stage, err := deduplication.New(deduplication.Config{Store: inboxStore, Consumer: "inventory"})
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set(sluice.EventIDKey, "evt-1")
	msg.SetContext(t.Context())
	h := reserve(outboxStore)
	_, err = stage(func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) })(msg)
	require.NoError(t, err)
	require.NoError(t, createOrder(t.Context(), db, outboxStore, message.NewMessage(watermill.NewUUID(), nil)))
	b, err := outboxStore.Due(t.Context(), 10, 0)
	require.NoError(t, err)
	require.Len(t, b.Rows(), 2)
	require.Equal(t, "inventory.reserved", b.Rows()[0].Topic)
	require.Equal(t, "orders.created", b.Rows()[1].Topic)
	require.NoError(t, b.Release(t.Context()))
}
