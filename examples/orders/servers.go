package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the PostgreSQL driver

	amqp "github.com/sluicemq/sluice/internal/amqp091"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/router"
)

const outboxTopic = "outbox"

// serversEnv: RabbitMQ and PostgreSQL. The example's tables live in a schema
// of its own, and its queues are named after it; both are emptied when it
// starts. The rejection event goes through a transactional outbox: written by
// watermill-sql's publisher in the inbox transaction, relayed to RabbitMQ by
// Watermill's forwarder.
type serversEnv struct {
	pg      *sqlx.DB
	schema  string
	amqpURL string
	queue   string
	conn    *amqp.Connection
	rabbit  *rabbitmq.Broker

	schemaAdapter wsql.DefaultPostgreSQLSchema
	fwd           *forwarder.Forwarder
	fwdDone       chan error
}

// ErrExists is returned when the schema the servers mode would use exists
// and --reset was not given: the example never drops what it was not asked to.
var ErrExists = errors.New("exists: pass --reset to drop it and purge its queues, or choose another --name")

func newServersEnv(ctx context.Context, amqpURL, postgresURL, name string, reset bool) (_ *serversEnv, err error) {
	if postgresURL == "" || amqpURL == "" {
		return nil, errors.New("the servers mode needs both --amqp-url and --postgres-url")
	}
	e := &serversEnv{schema: name, amqpURL: amqpURL, queue: name + ".inventory"}
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
		return nil, fmt.Errorf("connecting to %s: %w", diag.RedactURL(postgresURL), diag.RedactError(err))
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
	e.schemaAdapter = wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return fmt.Sprintf(`%s."watermill_%s"`, name, topic) },
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

func (e *serversEnv) queues() []string {
	topo := e.rabbit.Topology()
	qs := []string{topo.Queue(), topo.PoisonQueue(), rejectedQueue(e.schema)}
	for _, t := range topo.Tiers() {
		qs = append(qs, t.Topic)
	}
	return qs
}

func (e *serversEnv) db() *sqlx.DB   { return e.pg }
func (e *serversEnv) tables() tables { return tables(e.schema) }
func (e *serversEnv) inventory() *inventory {
	return &inventory{tables: tables(e.schema), outbox: func(tx *sqlx.Tx) (message.Publisher, error) {
		pub, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: e.schemaAdapter}, watermill.NopLogger{})
		if err != nil {
			return nil, err
		}
		return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: outboxTopic}), nil
	}}
}

func (e *serversEnv) add(r *message.Router, h router.HandlerConfig) error {
	// With the outbox the handler returns no messages; the router's own
	// publishing is not used.
	h.PublishTopic, h.Publisher = rejectedQueue(e.schema), e.rabbit.Publisher()
	h.Broker = e.rabbit
	_, err := router.Add(r, h)
	return err
}

// start runs the outbox relay: the forwarder reads the outbox table and
// publishes each event with the confirmed publisher, to a queue named after
// the example.
func (e *serversEnv) start(ctx context.Context) error {
	sub, err := wsql.NewSubscriber(e.pg, wsql.SubscriberConfig{
		SchemaAdapter:    e.schemaAdapter,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: func(topic string) string { return fmt.Sprintf(`%s."watermill_offsets_%s"`, e.schema, topic) }},
		InitializeSchema: true,
		ConsumerGroup:    "relay",
		PollInterval:     50 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	if err := sub.SubscribeInitialize(outboxTopic); err != nil {
		return err
	}
	out := renaming{pub: e.rabbit.Publisher(), to: rejectedQueue(e.schema)}
	e.fwd, err = forwarder.NewForwarder(sub, out, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: outboxTopic})
	if err != nil {
		return err
	}
	e.fwdDone = make(chan error, 1)
	go func() { e.fwdDone <- e.fwd.Run(context.WithoutCancel(ctx)) }()
	<-e.fwd.Running()
	return nil
}

// renaming publishes the rejection events to the example's own queue.
type renaming struct {
	pub message.Publisher
	to  string
}

func (r renaming) Publish(_ string, msgs ...*message.Message) error {
	return r.pub.Publish(r.to, msgs...)
}
func (r renaming) Close() error { return nil }

func (e *serversEnv) publish(msgs ...*message.Message) error {
	return e.rabbit.Publisher().Publish(e.queue, msgs...)
}

func (e *serversEnv) poisoned(ctx context.Context) ([]*message.Message, error) {
	return e.peek(ctx, e.rabbit.Topology().PoisonQueue())
}

func (e *serversEnv) rejectionEvents(ctx context.Context) (int, error) {
	msgs, err := e.peek(ctx, rejectedQueue(e.schema))
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
	if e.fwd != nil {
		errs = append(errs, e.fwd.Close(), <-e.fwdDone)
	}
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
