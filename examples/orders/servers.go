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
)

// serversEnv: RabbitMQ and PostgreSQL. The example's tables live in a schema
// of its own, and its queues are named after it; both are emptied when it
// starts. The rejection event goes through Sluice's outbox, as in the
// embedded default: a row of the inbox transaction, relayed to a queue named
// after the example by the broker's confirmed publisher.
type serversEnv struct {
	pg      *sqlx.DB
	name    string // the schema, and the queues' prefix
	amqpURL string
	queue   string
	conn    *amqp.Connection
	rabbit  *rabbitmq.Broker
}

// ErrExists is returned when the schema the servers mode would use exists
// and --reset was not given: the example never drops what it was not asked to.
var ErrExists = errors.New("exists: pass --reset to drop it and purge its queues, or choose another --name")

func newServersEnv(ctx context.Context, amqpURL, postgresURL, name string, reset bool) (_ *serversEnv, err error) {
	if postgresURL == "" || amqpURL == "" {
		return nil, errors.New("the servers mode needs both --amqp-url and --postgres-url")
	}
	e := &serversEnv{name: name, amqpURL: amqpURL, queue: name + ".inventory"}
	defer func() { // a failed start closes what it opened
		if err != nil {
			_ = e.close()
		}
	}()
	db, err := sqlx.ConnectContext(ctx, "postgres", postgresURL)
	if err != nil {
		if db != nil { // sqlx returns the pool open when the ping fails
			_ = db.Close()
		}
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
	e.conn, err = rabbitmq.Dial(rabbitmq.DialConfig{Connection: rabbitmq.Connection{URL: amqpURL}, Name: "sluice example"})
	if err != nil {
		return nil, err
	}
	e.rabbit, err = rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: amqpURL},
		Topology:   rabbitmq.TopologyConfig{Queue: e.queue, TierDelays: tierDelays},
	})
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

// queues are the example's queues: the consumer's, its tiers' (every
// sub-queue of a jittered tier), its poison queue's, and the rejections'.
func (e *serversEnv) queues() []string {
	qs := []string{rejectedQueue(e.name)}
	for _, q := range e.rabbit.Topology().Queues() {
		qs = append(qs, q.Name)
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
func (e *serversEnv) broker() broker.Broker  { return e.rabbit }
func (e *serversEnv) rejectionTopic() string { return rejectedQueue(e.name) }

// relayPublisher is the broker's publisher: confirms and mandatory, so a
// rejection event the broker cannot route stays in the outbox with its error.
func (e *serversEnv) relayPublisher() message.Publisher { return e.rabbit.Publisher() }

func (e *serversEnv) start(context.Context) error { return nil }

func (e *serversEnv) publish(msgs ...*message.Message) error {
	return e.rabbit.Publisher().Publish(e.queue, msgs...)
}

func (e *serversEnv) poisoned(ctx context.Context) ([]*message.Message, error) {
	return e.peek(ctx, e.rabbit.Topology().PoisonQueue())
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
	for _, t := range e.rabbit.Topology().Tiers() {
		q, err := ch.QueueDeclarePassive(t.Topic, true, false, false, false, nil)
		if err != nil {
			return 0, err
		}
		n += q.Messages
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
		m, err := rabbitmq.Marshaler{}.UnmarshalDelivery(d)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
}

func (e *serversEnv) close() error {
	var errs []error
	if e.rabbit != nil {
		errs = append(errs, e.rabbit.Close())
	}
	if e.conn != nil {
		_ = e.conn.Close()
	}
	if e.pg != nil {
		_ = e.pg.Close()
	}
	return errors.Join(errs...)
}
