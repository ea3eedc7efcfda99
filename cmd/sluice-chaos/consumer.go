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
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the PostgreSQL driver

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// event is the payload the producer publishes.
type event struct {
	EventID   string `json:"eventId"`
	FailTimes int    `json:"failTimes"` // transient failures before it succeeds
	Invariant bool   `json:"invariant"` // the handler finds a broken invariant
}

// consumerMain runs one consumer process: the whole Sluice stack around a
// handler that writes one business row per event, crashing itself (SIGKILL)
// with probability crashProb at the chosen crash points.
func consumerMain(args []string) error {
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	amqpURL := fs.String("amqp-url", "", "the broker's URL, or a cluster's node URLs comma-separated (tried in that order)")
	quorum := fs.Bool("quorum", false, "declare the topology with quorum queues (rabbitmq.TopologyConfig.Quorum)")
	pgURL := fs.String("postgres-url", "", "")
	queue := fs.String("queue", "", "")
	schema := fs.String("schema", "", "")
	tiers := fs.String("tiers", "", "")
	consumers := fs.Int("consumers", 0, "")
	subscriber := fs.String("subscriber", "sluice", "")
	crashProb := fs.Float64("crash-prob", 0, "")
	crashPoints := fs.String("crash-points", "", "before-commit,after-commit,after-tier-publish")
	relayCrashProb := fs.Float64("relay-crash-prob", 0, "the crash probability at the relay's crash points (relay-…), once per batch")
	produceTo := fs.String("produce-to", "", "a queue: produce one message per event there through the outbox, relay it, and receive it (the outbox scenario)")
	maxBatch := fs.Int("max-batch", 0, "group commit on every inbox with this MaxBatch (0: one transaction per delivery)")
	maxWait := fs.Duration("max-wait", 0, "group commit's MaxWait (0: its default)")
	prefetch := fs.Int("prefetch", 0, "deliveries in flight per subscription (0: the broker's default)")
	batchHandler := fs.Int("batch-handler", 0, "handle the events with a batch handler of this MaxBatch (router.HandlerConfig.BatchHandler; 0: a handler per delivery)")
	trace := fs.Bool("trace", false, "print a line per delivery, result and retry or poison publish of each event (trace <id> <what>), for the harness to show for the events missing at the end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	points := map[string]bool{}
	for _, p := range strings.Split(*crashPoints, ",") {
		points[p] = true
	}
	crashes := func(point string) bool {
		prob := *crashProb
		if strings.HasPrefix(point, "relay-") {
			prob = *relayCrashProb
		}
		return points[point] && rand.Float64() < prob
	}
	crashNow := func(point string) {
		fmt.Fprintln(os.Stderr, "crash", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Second)
	}
	crash := func(point string) {
		if crashes(point) {
			crashNow(point)
		}
	}
	tr := func(id, format string, args ...any) {
		if *trace {
			// One short line, one write: lines of concurrent handlers do
			// not interleave on the pipe.
			fmt.Fprintf(os.Stderr, "trace %s %s %s\n", id, time.Now().Format(traceClock), fmt.Sprintf(format, args...))
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	db, err := sqlx.Open("postgres", *pgURL)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(rabbitmqPrefetch + 2)
	if *produceTo != "" { // a receiver's deliveries and a relay's batch too
		db.SetMaxOpenConns(rabbitmqPrefetch + 6)
	}
	db.SetMaxIdleConns(rabbitmqPrefetch + 6) // keep them (database/sql keeps 2): each new one is a server process
	store, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: *schema + ".inbox"})
	if err != nil {
		return err
	}
	delays, err := parseDelays(*tiers)
	if err != nil {
		return err
	}
	brokerCfg := rabbitmq.BrokerConfig{Connection: amqpConnection(*amqpURL), Topology: rabbitmq.TopologyConfig{Queue: *queue, TierDelays: delays, Quorum: *quorum},
		WatermillSubscriber: *subscriber == "watermill", Prefetch: *prefetch}
	inbox := func(store deduplication.Store, consumer string, key sluice.KeyFunc) *deduplication.Config {
		return &deduplication.Config{Store: store, Consumer: consumer, Key: key}
	}
	if *maxBatch > 0 {
		inbox = func(store deduplication.Store, consumer string, key sluice.KeyFunc) *deduplication.Config {
			return &deduplication.Config{Store: store, Consumer: consumer, Key: key, Env: sluice.Env{MeterProvider: batchSizes{}}, Batch: &deduplication.BatchConfig{MaxBatch: *maxBatch, MaxWait: *maxWait}}
		}
	}
	q, err := dialBroker(ctx, brokerCfg) // the broker may be restarting when a consumer starts
	if err != nil {
		return err
	}
	defer func() { _ = q.Close() }()

	insert := `INSERT INTO ` + *schema + `.effects (event_id) VALUES ($1)`
	waiting := &awaiting{ids: map[string]struct{}{}}
	handler := func(msg *message.Message) error {
		var e event
		if err := json.Unmarshal(msg.Payload, &e); err != nil {
			return err
		}
		attempt, _ := sluice.Attempt(msg)
		tr(e.EventID, "attempt %d (fails %d times)", attempt, e.FailTimes)
		if attempt <= e.FailTimes {
			return fmt.Errorf("downstream: %w", context.DeadlineExceeded)
		}
		if e.Invariant {
			return sluice.Invariant(fmt.Errorf("event %s: the order must exist", e.EventID))
		}
		tx := sluicesql.TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), insert, e.EventID); err != nil {
			return err
		}
		tr(e.EventID, "effect written, not committed")
		crash("before-commit") // claimed and written, not committed
		// With group commit: others' handlers done, waiting for their commit.
		if n := waiting.handled(msg.UUID); n > 0 && crashes(midBatchPoint) {
			fmt.Fprintln(os.Stderr, "count mid-batch-awaiting", n)
			crashNow(midBatchPoint)
		}
		return nil
	}
	afterCommit := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			attempt, _ := sluice.Attempt(msg)
			tr(msg.Metadata.Get(chaosIDKey), "delivered (attempt %d)", attempt)
			out, err := h(msg)
			tr(msg.Metadata.Get(chaosIDKey), "handled: %v (nil: acked next)", err)
			waiting.returned(msg.UUID)
			if err == nil {
				crash(crashPoint(msg)) // committed, not acked
			}
			return out, err
		}
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	// Added first, so outermost: it sees the result after the inbox committed.
	r.AddMiddleware(afterCommit)
	cfg := router.HandlerConfig{
		Broker: q,
		Name:   "effects", Consumers: *consumers, Handler: handler,
		Stages: router.Stages{
			Poison:    &poison.Config{Publisher: tracingPublisher{q.Publisher(), tr, "poison copy"}, Env: sluice.Env{PublishBackoff: 200 * time.Millisecond}},
			Retry:     &retrytiers.Config{Publisher: crashingPublisher{q.Publisher(), crash, tr}, Env: sluice.Env{PublishBackoff: 200 * time.Millisecond}},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     inbox(store, "effects", sluice.KeyFromJSON("eventId")),
			Recoverer: &stage.RecovererConfig{},
		},
	}
	if *batchHandler > 0 {
		cfg.Handler = nil
		cfg.Stages.Inbox.MeterProvider = batchSizes{}
		cfg.BatchHandler = &deduplication.BatchHandler{MaxBatch: *batchHandler, MaxWait: *maxWait,
			Handle: batchHandle(*schema, tr, crash, crashes, crashNow)}
	}
	var ob *outboxProcess
	if *produceTo != "" {
		ob = &outboxProcess{db: db, schema: *schema, queue: *produceTo, crash: crash, inbox: inbox}
		if err := ob.start(ctx, r, &cfg, brokerCfg, q.Publisher()); err != nil {
			return errors.Join(err, ob.close())
		}
	}
	if _, err = router.Add(r, cfg); err == nil {
		context.AfterFunc(ctx, func() { tr("harness", "process %d: SIGTERM", os.Getpid()) })
		err = r.Run(ctx)
	}
	return errors.Join(err, ob.close())
}

// crashingPublisher crashes after a retry copy is confirmed, before the
// original is acked.
type crashingPublisher struct {
	message.Publisher
	crash func(string)
	trace func(id, format string, args ...any)
}

func (p crashingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := tracingPublisher{p.Publisher, p.trace, "retry copy"}.Publish(topic, msgs...)
	if err == nil {
		p.crash("after-tier-publish")
	}
	return err
}

// tracingPublisher traces each publish of what (consumer --trace): the
// event, the topic and the publisher's answer.
type tracingPublisher struct {
	message.Publisher
	trace func(id, format string, args ...any)
	what  string
}

func (p tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	sent := time.Now() // no delivery of a copy comes before its publish began
	err := p.Publisher.Publish(topic, msgs...)
	if p.trace != nil {
		for _, m := range msgs {
			p.trace(m.Metadata.Get(chaosIDKey), "%s published to %s (sent %s): %v", p.what, topic, sent.Format(traceClock), err)
		}
	}
	return err
}

// amqpConnection is the connection of a comma-separated list of node URLs:
// URL for one, URLs for a cluster's nodes (a comma inside a password is
// written %2C, as for the sluice CLI).
func amqpConnection(list string) rabbitmq.Connection {
	urls := strings.Split(list, ",")
	if len(urls) == 1 {
		return rabbitmq.Connection{URL: urls[0]}
	}
	return rabbitmq.Connection{URLs: urls}
}

func parseDelays(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, p := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(p))
		if err != nil {
			return nil, errors.New("bad --tiers " + s)
		}
		out = append(out, d)
	}
	return out, nil
}

// batchHandle is the chaos handler as a batch handler: each event fails as
// the handler per delivery fails it (transiently its first failTimes
// attempts, an invariant, JSON of another shape), the others' rows are
// written in one INSERT; then the process may crash, the batch written and
// not committed (before-commit, and mid-batch when the batch holds more
// than one event).
func batchHandle(schema string, tr func(id, format string, args ...any), crash func(string), crashes func(string) bool, crashNow func(string)) func(context.Context, []*message.Message) []error {
	insert := `INSERT INTO ` + schema + `.effects (event_id) SELECT jsonb_array_elements_text($1::jsonb)`
	return func(ctx context.Context, msgs []*message.Message) []error {
		out := make([]error, len(msgs))
		var ids []string
		for i, msg := range msgs {
			var e event
			if err := json.Unmarshal(msg.Payload, &e); err != nil {
				out[i] = err
				continue
			}
			attempt, _ := sluice.Attempt(msg)
			tr(e.EventID, "attempt %d (fails %d times), in a batch of %d", attempt, e.FailTimes, len(msgs))
			switch {
			case attempt <= e.FailTimes:
				out[i] = fmt.Errorf("downstream: %w", context.DeadlineExceeded)
			case e.Invariant:
				out[i] = sluice.Invariant(fmt.Errorf("event %s: the order must exist", e.EventID))
			default:
				ids = append(ids, e.EventID)
			}
		}
		if len(ids) == 0 {
			return out
		}
		rows, err := json.Marshal(ids)
		if err == nil {
			_, err = sluicesql.TxFromContext(ctx).ExecContext(ctx, insert, string(rows))
		}
		if err != nil {
			return deduplication.SameOutcome(msgs, err)
		}
		for _, id := range ids {
			tr(id, "effect written in a batch of %d, not committed", len(ids))
		}
		crash("before-commit") // claimed and written, not committed
		if len(ids) > 1 && crashes(midBatchPoint) {
			fmt.Fprintln(os.Stderr, "count mid-batch-awaiting", len(ids)-1)
			crashNow(midBatchPoint)
		}
		return out
	}
}
