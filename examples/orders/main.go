// Command orders is Sluice's bundled example: a service with two handlers
// of order.created events behind the whole Sluice stack — an inventory that
// reserves stock, and an order log that records each event once.
//
//	make run                      # the embedded default: in-process broker + SQLite, no servers
//	go run ./examples/orders --amqp-url amqp://guest:guest@127.0.0.1:5672/ \
//	    --postgres-url 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// A producer publishes a scripted mix — new orders, duplicate deliveries of
// the same eventId, a stock service that times out once or twice, an order
// for a product out of stock, a malformed payload, an order that must exist
// but does not — and the example prints what the stores and queues hold at
// the end. Both handlers are service.Handlers of one service.Service, each
// with the whole stack and production defaults, each consuming every event
// on a queue of its own (on RabbitMQ, two queues bound to one exchange; on
// the embedded default, whose topics have no fan-out, an embedded broker
// each, the producer publishing to both):
//
//   - inventory (inventory.go) reads stock and decides per event, a
//     PublishingHandler: the rejection event goes through the
//     transactional outbox and the service's relay.
//   - orderlog (orderlog.go) writes a row per event and reads nothing, a
//     BatchHandler: the deliveries in flight claimed in one statement,
//     written in one multi-row INSERT, one COMMIT per batch; each event
//     logged once, the duplicate deliveries left out by the inbox
//     (docs/batch-handlers.md says when to choose it over GroupCommit).
//
// --metrics-addr serves Prometheus metrics (package promexport);
// --trace-stdout prints the spans.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/promexport"
	"github.com/sluicemq/sluice/service"
	"github.com/sluicemq/sluice/sluicesql"
)

// config is what the flags choose.
type config struct {
	AMQPURL, PostgresURL string
	DBPath               string // SQLite file in the embedded mode
	Name                 string // schema and queue prefix in the servers mode
	Reset                bool   // drop the schema and purge the queues of Name first
	MetricsAddr          string
	TraceOut             io.Writer
}

func main() {
	var cfg config
	var traceStdout bool
	flag.StringVar(&cfg.AMQPURL, "amqp-url", os.Getenv("SLUICE_AMQP_URL"), "RabbitMQ URL: run on RabbitMQ + PostgreSQL (env SLUICE_AMQP_URL)")
	flag.StringVar(&cfg.PostgresURL, "postgres-url", os.Getenv("SLUICE_POSTGRES_URL"), "PostgreSQL URL (env SLUICE_POSTGRES_URL)")
	flag.StringVar(&cfg.DBPath, "db", "", "SQLite file in the embedded mode (default: a new file in a temporary directory)")
	flag.StringVar(&cfg.Name, "name", "sluice_example", "schema and queue prefix in the servers mode")
	flag.BoolVar(&cfg.Reset, "reset", false, "servers mode: drop the schema --name and purge its queues first (needed when they exist: never dropped unasked)")
	flag.StringVar(&cfg.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9464) until interrupted")
	flag.BoolVar(&traceStdout, "trace-stdout", false, "print the spans to stdout")
	flag.Parse()
	if traceStdout {
		cfg.TraceOut = os.Stdout
	}
	if err := runAndPrint(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func runAndPrint(cfg config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := run(ctx, cfg)
	if err != nil {
		return err
	}
	s.print(os.Stdout)
	if cfg.MetricsAddr == "" {
		return nil
	}
	fmt.Printf("\nserving Prometheus metrics on http://%s/metrics — Ctrl-C to stop\n", cfg.MetricsAddr)
	srv := &http.Server{Addr: cfg.MetricsAddr, Handler: s.metrics, ReadHeaderTimeout: 5 * time.Second}
	return srv.ListenAndServe()
}

// embeddedNote is what make run says of the embedded default.
const embeddedNote = "embedded default (in-process broker + SQLite): the queue and the retry tiers live in this process's\n" +
	"memory, bounded and NOT durable — what waits there is lost if the process stops (Close names it).\n" +
	"Run on RabbitMQ + PostgreSQL for durable tiers: go run ./examples/orders --amqp-url … --postgres-url …"

// newEnv starts the servers mode or the embedded default. It returns a nil
// interface (never a nil pointer in one) with its error.
func newEnv(ctx context.Context, cfg config) (env, error) {
	if cfg.AMQPURL != "" || cfg.PostgresURL != "" {
		e, err := newServersEnv(ctx, cfg.AMQPURL, cfg.PostgresURL, cmp.Or(cfg.Name, "sluice_example"), cfg.Reset)
		if err != nil {
			return nil, err
		}
		return e, nil
	}
	e, err := newEmbeddedEnv(ctx, cfg.DBPath)
	if err != nil {
		return nil, err
	}
	return e, nil
}

func run(ctx context.Context, cfg config) (_ *summary, err error) {
	counts := sdkmetric.NewManualReader() // what the summary reads; the exporter serves the same
	metrics, err := promexport.New(promexport.Config{Readers: []sdkmetric.Reader{counts}})
	if err != nil {
		return nil, err
	}
	var traceOpts []sdktrace.TracerProviderOption
	if cfg.TraceOut != nil {
		exporter, err := stdouttrace.New(stdouttrace.WithWriter(cfg.TraceOut), stdouttrace.WithPrettyPrint())
		if err != nil {
			return nil, err
		}
		traceOpts = append(traceOpts, sdktrace.WithSyncer(exporter))
	}
	tracer := sdktrace.NewTracerProvider(traceOpts...)
	defer func() { _ = tracer.Shutdown(context.WithoutCancel(ctx)) }()

	e, err := newEnv(ctx, cfg)
	if err != nil { // a failed start has closed what it opened
		return nil, err
	}
	defer func() { // what the broker did not finish fails the run: the summary would not show it
		if cerr := e.close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing: %w", cerr)
		}
	}()

	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	// The whole stack with production defaults: the inbox, outbox and replay
	// outcome tables in the env's database, the relay publishing the
	// rejection event after its commit, the pruners, health.
	svc, err := service.New(service.Config{DB: e.db(), Schema: e.schema(), Router: r, Publisher: e.relayPublisher(),
		Env: sluice.Env{MeterProvider: metrics, TracerProvider: tracer}})
	if err != nil {
		return nil, err
	}
	if err := svc.Stores().Migrate(ctx); err != nil {
		return nil, err
	}
	err = svc.Add(service.Handler{
		Name:              inventoryHandler,
		Broker:            e.broker(inventoryHandler),
		Key:               sluice.KeyFromJSON("eventId"),
		PublishingHandler: (&inventory{tables: e.tables()}).reserve,
		PublishTopic:      e.rejectionTopic(),
	})
	if err != nil {
		return nil, err
	}
	// The order log: a row per event, no reads, no decisions — a batch
	// handler (one claim statement, one INSERT, one COMMIT per batch).
	err = svc.Add(service.Handler{
		Name:         orderLogHandler,
		Broker:       e.broker(orderLogHandler),
		Key:          sluice.KeyFromJSON("eventId"),
		BatchHandler: &deduplication.BatchHandler{Handle: (&orderLog{tables: e.tables()}).record},
	})
	if err != nil {
		return nil, err
	}
	if err := e.start(ctx); err != nil {
		return nil, err
	}
	routerDone := make(chan error, 1)
	go func() { routerDone <- r.Run(context.WithoutCancel(ctx)) }()
	<-r.Running()
	stop := sync.OnceValue(func() error { return errors.Join(svc.Close(), <-routerDone) })
	defer func() { // before the env closes: the relay publishes on its broker
		if cerr := stop(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the service: %w", cerr)
		}
	}()

	producer := stage.TracingPublisher(publisherFunc(e.publish), stage.TraceConfig{Env: sluice.Env{TracerProvider: tracer}})
	if err := producer.Publish("order.created", scriptMessages()...); err != nil {
		return nil, err
	}
	waitErr := waitSettled(ctx, e, svc.Stores().Outbox, counts)
	ready := svc.Ready(ctx) // what /readyz would answer
	// Close: the router closed, what the handlers committed published, the
	// relay and the pruners stopped.
	if err := errors.Join(waitErr, stop()); err != nil {
		return nil, err
	}
	s, err := summarize(ctx, e, svc.Stores().Outbox, counts)
	if err != nil {
		return nil, err
	}
	s.Ready = ready.Status
	s.metrics = metrics
	if _, embedded := e.(*embeddedEnv); embedded {
		s.Note = embeddedNote
	}
	return s, nil
}

// waitSettled waits until the stores, queues and metrics show the
// scenario's end: every event committed, poisoned or left out as a
// duplicate by both handlers, the rejection event delivered and deleted
// from the outbox, no copy left in a tier.
func waitSettled(ctx context.Context, e env, ob *sluicesql.Outbox, counts metricReader) error {
	for {
		s, err := summarize(ctx, e, ob, counts)
		if err != nil {
			return err
		}
		inv, log := s.Inventory, s.OrderLog
		if inv.Inbox >= expected.committed && len(inv.Poisoned) >= expected.poisoned && inv.Duplicates >= expected.duplicates &&
			log.Inbox >= expected.logged && len(log.Poisoned) >= expected.logPoisoned && log.Duplicates >= expected.duplicates &&
			s.RejectionEvents >= expected.rejected && s.PendingRetries == 0 && s.OutboxRows == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the scenario did not settle: inventory: %d of %d events committed, %d of %d poisoned, %d of %d duplicates; "+
				"order log: %d of %d events committed, %d of %d poisoned, %d of %d duplicates; "+
				"%d of %d rejection events, %d copies in the tiers, %d rows in the outbox: %w",
				inv.Inbox, expected.committed, len(inv.Poisoned), expected.poisoned, inv.Duplicates, expected.duplicates,
				log.Inbox, expected.logged, len(log.Poisoned), expected.logPoisoned, log.Duplicates, expected.duplicates,
				s.RejectionEvents, expected.rejected, s.PendingRetries, s.OutboxRows, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// publisherFunc adapts a publish function to message.Publisher.
type publisherFunc func(msgs ...*message.Message) error

func (f publisherFunc) Publish(_ string, msgs ...*message.Message) error { return f(msgs...) }
func (f publisherFunc) Close() error                                     { return nil }
