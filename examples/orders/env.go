package main

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/deduplication/sqlstore"
	"github.com/sluicemq/sluice/router"
)

// env is where the example runs: the embedded default or RabbitMQ +
// PostgreSQL. Every number the example prints is read from it.
type env interface {
	db() *sqlx.DB
	tables() tables
	// inventory returns the handler's service, with an outbox where there is one.
	inventory() *inventory
	// add adds the reliable handler to r.
	add(r *message.Router, h router.HandlerConfig) error
	// start starts what runs beside the router (the outbox relay).
	start(ctx context.Context) error
	publish(msgs ...*message.Message) error
	// poisoned reads back the poison queue.
	poisoned(ctx context.Context) ([]*message.Message, error)
	// rejectionEvents counts the rejection events delivered.
	rejectionEvents(ctx context.Context) (int, error)
	// pendingRetries counts the copies waiting in the tiers.
	pendingRetries(ctx context.Context) (int, error)
	close() error
}

// tierDelays are short, for a demonstration that ends in seconds.
var tierDelays = []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}

// newInboxStore creates the inbox table in the env's database.
func newInboxStore(ctx context.Context, db *sqlx.DB, t tables) (*sqlstore.Store, error) {
	store, err := sqlstore.New(sqlstore.Config{DB: db, Table: t.of("sluice_inbox")})
	if err != nil {
		return nil, err
	}
	return store, store.CreateTable(ctx)
}
