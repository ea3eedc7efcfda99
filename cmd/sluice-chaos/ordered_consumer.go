package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/ordering"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// orderedHandlerName is the ordered scenario's handler: the consumer of
// the ordering store's keys.
const orderedHandlerName = "ledger"

// orderedResumeInterval is the consumers' ordering.Config.ResumeInterval:
// how soon a skipped key's release starts without a delivery of its own.
const orderedResumeInterval = 500 * time.Millisecond

// orderedConsumerMain runs one consumer process of the ordered scenario:
// the whole stack with Stages.Order (or, with --unordered, without it)
// around a handler that appends (key, seq) to the effects table in the
// inbox's transaction, fails an event transiently failTimes times, poisons
// a poisoned head, and SIGKILLs its own process with probability crashProb
// before its commit, after it, and after a retry copy was confirmed.
func orderedConsumerMain(args []string) error {
	fs := flag.NewFlagSet("ordered-consumer", flag.ContinueOnError)
	amqpURL := fs.String("amqp-url", "", "the broker's URL")
	pgURL := fs.String("postgres-url", "", "")
	queue := fs.String("queue", "", "")
	schema := fs.String("schema", "", "")
	tiers := fs.String("tiers", "", "")
	crashProb := fs.Float64("crash-prob", 0, "")
	unordered := fs.Bool("unordered", false, "without Stages.Order (the control run: the check must fail)")
	quorum := fs.Bool("quorum", false, "declare the topology with quorum queues (rabbitmq.TopologyConfig.Quorum)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	crash := func(point string) {
		if rand.Float64() < *crashProb {
			fmt.Fprintln(os.Stderr, "crash", point)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			time.Sleep(time.Second)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	db, err := sqlx.Open("postgres", *pgURL)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	// The deliveries in flight, each with its inbox transaction and its
	// key's guard, and the resume loop's.
	db.SetMaxOpenConns(2*rabbitmqPrefetch + 4)
	db.SetMaxIdleConns(2*rabbitmqPrefetch + 4) // keep them (database/sql keeps 2): each new one is a server process
	inbox, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: *schema + ".inbox"})
	if err != nil {
		return err
	}
	store, err := sluicesql.NewOrders(db, sluicesql.OrdersConfig{TablePrefix: *schema + ".order"})
	if err != nil {
		return err
	}
	delays, err := parseDelays(*tiers)
	if err != nil {
		return err
	}
	q, err := dialBroker(ctx, rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: *amqpURL},
		Topology: rabbitmq.TopologyConfig{Queue: *queue, TierDelays: delays, Quorum: *quorum}})
	if err != nil {
		return err
	}
	defer func() { _ = q.Close() }()

	insert := `INSERT INTO ` + *schema + `.effects (event_id, order_key, seq) VALUES ($1, $2, $3)`
	handler := func(msg *message.Message) error {
		var e orderedEvent
		if err := json.Unmarshal(msg.Payload, &e); err != nil {
			return sluice.Poison(err)
		}
		if e.Poison {
			return sluice.Poison(fmt.Errorf("event %s: unknown account version", e.EventID))
		}
		if attempt, _ := sluice.Attempt(msg); attempt <= e.FailTimes {
			return fmt.Errorf("downstream: %w", context.DeadlineExceeded)
		}
		tx := sluicesql.TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), insert, e.EventID, e.Key, e.Seq); err != nil {
			return err
		}
		crash("before-commit")
		return nil
	}
	afterCommit := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				crash("after-commit") // committed (and any release it ran), not acked
			}
			return out, err
		}
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	r.AddMiddleware(afterCommit)
	stages := router.Stages{
		Poison:    &poison.Config{Env: sluice.Env{PublishBackoff: 200 * time.Millisecond}},
		Retry:     &retrytiers.Config{Publisher: crashingPublisher{Publisher: q.Publisher(), crash: crash}, Env: sluice.Env{PublishBackoff: 200 * time.Millisecond}},
		Classify:  &stage.ClassifyConfig{},
		Inbox:     &deduplication.Config{Store: inbox, Key: sluice.KeyFromJSON("eventId")},
		Recoverer: &stage.RecovererConfig{},
	}
	if !*unordered {
		stages.Order = &ordering.Config{Store: store, Key: sluice.KeyFromJSON("key"), ResumeInterval: orderedResumeInterval}
	}
	if _, err := router.Add(r, router.HandlerConfig{Broker: q, Name: orderedHandlerName, Consumers: 1, Handler: handler, Stages: stages}); err != nil {
		return err
	}
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
