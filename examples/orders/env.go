package main

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice/broker"
)

// env is where the example runs: the embedded default or RabbitMQ +
// PostgreSQL. Every number the example prints is read from it.
type env interface {
	db() *sqlx.DB
	// schema is the PostgreSQL schema of the example's and Sluice's tables
	// ("" on SQLite).
	schema() string
	tables() tables
	// broker gives a handler (one of handlers) its queue, tiers and poison
	// queue: each handler its own, every order.created event on each.
	broker(handler string) broker.Broker
	// rejectionTopic is where the rejection event goes.
	rejectionTopic() string
	// relayPublisher is the confirmed publisher the outbox relay publishes
	// with: it returns once the broker holds the message.
	relayPublisher() message.Publisher
	// start starts what runs beside the router (counting the rejection
	// events in the embedded default).
	start(ctx context.Context) error
	// publish is the producer: each message reaches every handler's queue.
	publish(msgs ...*message.Message) error
	// poisoned reads back a handler's poison queue.
	poisoned(ctx context.Context, handler string) ([]*message.Message, error)
	// rejectionEvents counts the rejection events delivered.
	rejectionEvents(ctx context.Context) (int, error)
	// pendingRetries counts the copies waiting in the tiers of every
	// handler.
	pendingRetries(ctx context.Context) (int, error)
	close() error
}

// The example's handlers, each consuming every order.created event on a
// queue of its own: the inventory reserves stock (a PublishingHandler:
// reads and decisions per event), the order log records each event once (a
// BatchHandler: a row per event, one INSERT per batch).
const (
	inventoryHandler = "inventory"
	orderLogHandler  = "orderlog"
)

var handlers = []string{inventoryHandler, orderLogHandler}

// tierDelays are short, for a demonstration that ends in seconds.
var tierDelays = []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}
