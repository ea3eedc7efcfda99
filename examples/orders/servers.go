package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the PostgreSQL driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql/postgres"
)

// serversEnv: RabbitMQ and PostgreSQL. The example's tables live in a schema
// of its own, and its queues are named after it; both are emptied when it
// starts. Each handler consumes a queue of its own, "<name>.<handler>",
// bound to the exchange "<name>.orders" with the routing key order.created:
// the producer publishes each event once, to the exchange, and RabbitMQ
// routes it to both queues (the tiers return a copy to its own queue only).
// The rejection event goes through Sluice's outbox, as in the embedded
// default: a row of the inbox transaction, relayed to a queue named after
// the example by the inventory broker's confirmed publisher.
type serversEnv struct {
	pg       *sqlx.DB
	name     string // the schema, and the queues' prefix
	conn     *amqp.Connection
	rabbit   map[string]*rabbitmq.Broker // by handler
	producer *rabbitmq.Publisher         // confirmed, to the exchange
}

// ErrExists is returned when the schema the servers mode would use exists
// and --reset was not given: the example never drops what it was not asked to.
var ErrExists = errors.New("exists: pass --reset to drop it and purge its queues, or choose another --name")

func newServersEnv(ctx context.Context, amqpURL, postgresURL, name string, reset bool) (_ *serversEnv, err error) {
	if postgresURL == "" || amqpURL == "" {
		return nil, errors.New("the servers mode needs both --amqp-url and --postgres-url")
	}
	e := &serversEnv{name: name, rabbit: map[string]*rabbitmq.Broker{}}
	defer func() { // a failed start closes what it opened
		if err != nil {
			_ = e.close()
		}
	}()
	// As the README says: postgres.Open's pool bounds every dial and wait
	// (a pool of sqlx.Open's may not recover from a network fault, and
	// service.New says so) and keeps the connections its deliveries opened.
	db, err := postgres.Open(postgres.Config{DSN: postgresURL})
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redactURL(postgresURL), err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connecting to %s: %w", redactURL(postgresURL), err)
	}
	e.pg = db
	var exists bool
	if err := db.GetContext(ctx, &exists, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name); err != nil {
		return nil, err
	}
	if exists && !reset {
		return nil, fmt.Errorf("schema %s %w", name, ErrExists)
	}
	for _, stmt := range append([]string{`DROP SCHEMA IF EXISTS ` + name + ` CASCADE`, `CREATE SCHEMA ` + name}, tables(name).schema()...) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, err
		}
	}
	e.conn, err = rabbitmq.Dial(rabbitmq.Connection{URL: amqpURL}, "sluice example")
	if err != nil {
		return nil, err
	}
	for _, h := range handlers {
		cfg := rabbitmq.BrokerConfig{
			Connection: rabbitmq.Connection{URL: amqpURL},
			Topology:   rabbitmq.TopologyConfig{Queue: name + "." + h, TierDelays: tierDelays, Exchange: exchange(name), BindingKey: topic},
		}
		if h == orderLogHandler {
			cfg.Prefetch = 2 * 64 // twice BatchHandler.MaxBatch's default, 64: a batch gathers while the one before commits
		}
		if e.rabbit[h], err = rabbitmq.NewBroker(ctx, cfg); err != nil {
			return nil, err
		}
	}
	e.producer, err = rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: amqpURL}, Exchange: exchange(name)})
	if err != nil {
		return nil, err
	}
	ch, err := e.conn.Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDeclare(rejectedQueue(name), true, false, false, false, nil); err != nil {
		return nil, err
	}
	for _, q := range e.queues() {
		if _, err := ch.QueuePurge(q, false); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func rejectedQueue(name string) string { return name + "." + rejectedTopic }

// exchange is where the producer publishes order.created: bound to each
// handler's queue.
func exchange(name string) string { return name + ".orders" }

// queues are the example's queues: each consumer's, its tiers' (every
// sub-queue of a jittered tier), its poison queue's, and the rejections'.
func (e *serversEnv) queues() []string {
	qs := []string{rejectedQueue(e.name)}
	for _, h := range handlers {
		for _, q := range e.rabbit[h].Topology().Queues() {
			qs = append(qs, q.Name)
		}
	}
	return qs
}

// redactURL hides a URL's password (and a DSN that is no URL entirely):
// errors and logs carry no secret.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "the database"
	}
	return u.Redacted()
}

func (e *serversEnv) db() *sqlx.DB           { return e.pg }
func (e *serversEnv) schema() string         { return e.name }
func (e *serversEnv) tables() tables         { return tables(e.name) }
func (e *serversEnv) rejectionTopic() string { return rejectedQueue(e.name) }

func (e *serversEnv) broker(handler string) broker.Broker { return e.rabbit[handler] }

// relayPublisher is the inventory broker's publisher: confirms and
// mandatory, so a rejection event the broker cannot route stays in the
// outbox with its error.
func (e *serversEnv) relayPublisher() message.Publisher {
	return e.rabbit[inventoryHandler].Publisher()
}

func (e *serversEnv) start(context.Context) error { return nil }

// publish publishes to the exchange, once: RabbitMQ confirms each message
// once it is routed to both queues.
func (e *serversEnv) publish(msgs ...*message.Message) error {
	return e.producer.Publish(topic, msgs...)
}

func (e *serversEnv) poisoned(ctx context.Context, handler string) ([]*message.Message, error) {
	return e.peek(ctx, e.rabbit[handler].Topology().Config().PoisonQueue)
}

func (e *serversEnv) rejectionEvents(ctx context.Context) (int, error) {
	msgs, err := e.peek(ctx, rejectedQueue(e.name))
	return len(msgs), err
}

func (e *serversEnv) pendingRetries(context.Context) (int, error) {
	ch, err := e.conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	n := 0
	for _, h := range handlers {
		for _, t := range e.rabbit[h].Topology().Tiers() {
			q, err := ch.QueueDeclarePassive(t.Topic, true, false, false, false, nil)
			if err != nil {
				return 0, err
			}
			n += q.Messages
		}
	}
	return n, nil
}

// peek reads a queue's messages without taking them: each is fetched and
// then rejected back onto the queue when the channel closes unacked.
func (e *serversEnv) peek(_ context.Context, queue string) ([]*message.Message, error) {
	ch, err := e.conn.Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }() // returns the unacked messages to the queue
	var out []*message.Message
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil || !ok {
			return out, err
		}
		m, err := rabbitmq.Marshaler{}.Unmarshal(d)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
}

func (e *serversEnv) close() error {
	var errs []error
	if e.producer != nil {
		errs = append(errs, e.producer.Close())
	}
	for _, h := range handlers {
		if b := e.rabbit[h]; b != nil {
			errs = append(errs, b.Close())
		}
	}
	if e.conn != nil {
		_ = e.conn.Close()
	}
	if e.pg != nil {
		_ = e.pg.Close()
	}
	return errors.Join(errs...)
}
