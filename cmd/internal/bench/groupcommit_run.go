package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// gcPublishedKey carries the publish time (Unix nanoseconds) of a message of
// a paced run.
const gcPublishedKey = "bench_published"

// gcCase is one run of the groupcommit and consumer-inbox suites: the full
// stack (Trace, Poison, Retry, Classify, Inbox, Recoverer) assembled by
// router.Add on a rabbitmq.NewBroker of a fresh queue (Sluice's Consumer),
// one business INSERT per delivery in the inbox's transaction.
type gcCase struct {
	n, subs  int
	prefetch int                        // 0: the Consumer's default
	batch    *deduplication.BatchConfig // nil: one transaction per delivery
	// noop: a handler that does nothing and no stages, on the same broker:
	// the rate at which the broker and the machine deliver at all.
	noop bool
	// work is simulated I/O (a sleep) in the handler, inside the inbox's
	// transaction, before the INSERT.
	work time.Duration
	// failing: every 10th delivery fails transiently on its first attempt
	// and is parked in the first tier (30 s: it comes back after the run).
	failing bool
	// rate > 0: the messages are published at this rate while the stack
	// consumes them, each stamped with its publish time (latency); 0: they
	// are preloaded.
	rate float64
	// batchHandler: the same effect (one business row per event) written
	// by a batch handler, one INSERT per batch; batch does not apply.
	batchHandler *deduplication.BatchHandler
	// label, when set, labels the run's CPU in a -cpuprofile (pprof label
	// "run"; the preload's publishes are labelled "preload"):
	// go tool pprof -tagfocus 'run=LABEL' sluice-bench PROFILE.
	label string
	// poisonEvery > 0: every poisonEvery-th delivery fails as Poison (its
	// batch runs again without it; the poison stage parks it).
	poisonEvery int
}

type gcResult struct {
	handled float64 // deliveries handled per second: healthy + parked
	healthy float64 // healthy deliveries per second, until the last one
	// lat is publish → the stack returned (after the commit), per healthy
	// delivery of a paced run.
	lat []time.Duration
	// batches and batched count the group commits and the deliveries they
	// committed (sluice.inbox.batch.size); maxBatch is the largest.
	batches, batched, maxBatch int64
	// cpu is what the run cost per delivery, from the router's start until
	// the last delivery returned.
	cpu cpuCost
}

// gcRunner runs the cases of a suite on one PostgreSQL schema; a run that a
// restart of RabbitMQ or PostgreSQL (another job's chaos run on a shared
// machine) disrupts is discarded and run again, on a new connection.
type gcRunner struct {
	o         Options
	v         *inboxVariants
	conn      *amqp.Connection
	pub       *rabbitmq.Publisher
	closeConn func()
	// dropSchema drops the schema and closes the pool.
	dropSchema func()
}

// newGCRunner creates a schema named prefix plus a random suffix (a pool of
// 24 connections) with the inbox and business tables, and connects to
// RabbitMQ; Close drops the schema.
func newGCRunner(ctx context.Context, o Options, prefix string) (*gcRunner, error) {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, prefix, 24, nil)
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(24)
	v, err := newInboxVariants(ctx, db, schema)
	if err != nil {
		cleanup()
		return nil, err
	}
	conn, pub, closeConn, err := dialBroker(o)
	if err != nil {
		cleanup()
		return nil, err
	}
	return &gcRunner{o: o, v: v, conn: conn, pub: pub, closeConn: closeConn, dropSchema: cleanup}, nil
}

func (g *gcRunner) Close() {
	g.closeConn()
	g.dropSchema()
}

// run truncates the tables and runs gc, up to 3 times when disrupted.
func (g *gcRunner) run(ctx context.Context, gc gcCase, runID string) (gcResult, error) {
	var errs error
	for attempt := range 3 {
		if attempt > 0 {
			fmt.Fprintf(os.Stderr, "sluice-bench: run %s disrupted, run again: %v\n", runID, diag.Bound(errs.Error(), 300))
			g.closeConn()
			if err := sleepCtx(ctx, 5*time.Second); err != nil {
				return gcResult{}, err
			}
			conn, pub, closeConn, err := dialBroker(g.o)
			if err != nil {
				errs = errors.Join(errs, err)
				continue
			}
			g.conn, g.pub, g.closeConn = conn, pub, closeConn
		}
		err := g.v.truncate(ctx)
		if err == nil {
			var res gcResult
			if res, err = gcRun(ctx, g.conn, g.pub, g.o.AMQPURL, g.v, gc, fmt.Sprintf("%s-a%d-", runID, attempt)); err == nil {
				return res, nil
			}
		}
		if ctx.Err() != nil {
			return gcResult{}, err
		}
		errs = errors.Join(errs, err)
	}
	return gcResult{}, errs
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func gcRun(ctx context.Context, conn *amqp.Connection, pub *rabbitmq.Publisher, url string, v *inboxVariants, gc gcCase, runID string) (gcResult, error) {
	if gc.label != "" { // the goroutines the run starts (the broker's, the router's) inherit it
		defer pprof.SetGoroutineLabels(ctx)
		ctx = pprof.WithLabels(ctx, pprof.Labels("run", gc.label))
		pprof.SetGoroutineLabels(ctx)
	}
	rabbit, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: url}, Prefetch: gc.prefetch,
		Topology: rabbitmq.TopologyConfig{Queue: fmt.Sprintf("sluice_bench_gc_%d", time.Now().UnixNano())}})
	if err != nil {
		return gcResult{}, err
	}
	defer deleteTopology(conn, rabbit.Topology())
	defer func() { _ = rabbit.Close() }()
	queue := rabbit.Topology().Config().Queue

	msgs := make([]*message.Message, gc.n)
	healthy := gc.n
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msgs[i].Metadata.Set(sluice.EventIDKey, runID+strconv.Itoa(i))
		if gc.failing && i%10 == 0 {
			msgs[i].Metadata.Set("fail", "once")
			healthy--
		}
		if gc.poisonEvery > 0 && i%gc.poisonEvery == gc.poisonEvery-1 {
			msgs[i].Metadata.Set("fail", "poison")
			healthy--
		}
	}
	if gc.rate == 0 {
		var err error
		pprof.Do(ctx, pprof.Labels("run", "preload"), func(context.Context) {
			for i := 0; i < len(msgs) && err == nil; i += 500 {
				err = pub.Publish(queue, msgs[i:min(i+500, len(msgs))]...)
			}
		})
		if err != nil {
			return gcResult{}, err
		}
	}

	var (
		res                 gcResult
		handled, healthyN   atomic.Int64
		healthyAt           atomic.Int64 // since start, ns
		mu                  sync.Mutex
		finished            = make(chan struct{})
		start               time.Time
		errTransient        = errors.New("downstream timeout")
		errPoison           = errors.New("unknown product")
		reader              = sdkmetric.NewManualReader()
		meter               = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		publishing, runDone = make(chan error, 1), make(chan error, 1)
	)
	defer func() { _ = meter.Shutdown(context.WithoutCancel(ctx)) }()
	// Outside every stage: a delivery counts once the stack returned nil,
	// after its commit (or, parked, after its copy's confirm).
	var ph *phases
	if gc.batchHandler != nil {
		ph = newPhases()
	}
	outer := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ph.arrive(msg.UUID)
			out, err := h(msg)
			ph.returned(msg.UUID)
			if err != nil {
				return out, err
			}
			now := time.Now()
			if msg.Metadata.Get("fail") == "" {
				if ns, perr := strconv.ParseInt(msg.Metadata.Get(gcPublishedKey), 10, 64); perr == nil {
					mu.Lock()
					res.lat = append(res.lat, now.Sub(time.Unix(0, ns)))
					mu.Unlock()
				}
				if healthyN.Add(1) == int64(healthy) {
					healthyAt.Store(int64(now.Sub(start)))
				}
			}
			if handled.Add(1) == int64(gc.n) {
				close(finished)
			}
			return out, nil
		}
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return gcResult{}, err
	}
	r.AddMiddleware(outer)
	stages := router.Stages{
		Trace:     &stage.TraceConfig{},
		Poison:    &poison.Config{},
		Retry:     &retrytiers.Config{},
		Classify:  &stage.ClassifyConfig{},
		Inbox:     &deduplication.Config{Store: v.store, Consumer: "inventory", Batch: gc.batch, Env: sluice.Env{MeterProvider: meter}},
		Recoverer: &stage.RecovererConfig{},
	}
	switch {
	case gc.batchHandler != nil:
		bh := *gc.batchHandler
		bh.Handle = func(ctx context.Context, msgs []*message.Message) []error {
			if ph != nil {
				begin, ids := ph.since(), make([]string, len(msgs))
				for i, m := range msgs {
					ids[i] = m.UUID
				}
				defer ph.call(begin, ids)
			}
			out := make([]error, len(msgs))
			keys := make([]string, 0, len(msgs))
			for i, m := range msgs {
				if m.Metadata.Get("fail") == "poison" {
					out[i] = sluice.Poison(errPoison)
					continue
				}
				keys = append(keys, m.Metadata.Get(sluice.EventIDKey))
			}
			_, err := sluicesql.TxFromContext(ctx).ExecContext(ctx, v.insertBizBatch, strings.Join(keys, ","))
			if err != nil {
				return deduplication.SameOutcome(msgs, err)
			}
			return out
		}
		_, err := router.Add(r, router.HandlerConfig{Name: "bench", Broker: rabbit, Consumers: gc.subs, BatchHandler: &bh, Stages: stages})
		if err != nil {
			return gcResult{}, err
		}
	case gc.noop:
		for i := range gc.subs {
			r.AddConsumerHandler("bench-"+strconv.Itoa(i), queue, rabbit.Endpoints().Subscriber, func(*message.Message) error { return nil })
		}
	default:
		_, err := router.Add(r, router.HandlerConfig{
			Name: "bench", Broker: rabbit, Consumers: gc.subs,
			Handler: func(msg *message.Message) error {
				if msg.Metadata.Get("fail") == "once" && msg.Metadata.Get(sluice.AttemptKey) == "" {
					return sluice.Transient(errTransient)
				}
				if msg.Metadata.Get("fail") == "poison" {
					return sluice.Poison(errPoison)
				}
				if gc.work > 0 {
					time.Sleep(gc.work)
				}
				_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), v.insertBiz, msg.Metadata.Get(sluice.EventIDKey))
				return err
			},
			Stages: stages,
		})
		if err != nil {
			return gcResult{}, err
		}
	}

	cpu0 := sampleCPU()
	start = time.Now()
	go func() { runDone <- r.Run(context.WithoutCancel(ctx)) }()
	if gc.rate > 0 {
		go func() { publishing <- gcPublishPaced(pub, queue, msgs, gc.rate) }()
	} else {
		publishing <- nil
	}
	select {
	case <-finished:
	case err = <-runDone:
		err = fmt.Errorf("router stopped: %w", err)
	case <-time.After(5 * time.Minute):
		err = fmt.Errorf("run did not finish in 5 minutes: %d of %d handled", handled.Load(), gc.n)
	}
	elapsed := time.Since(start)
	res.cpu = costSince(cpu0, gc.n)
	if err != nil {
		_ = r.Close()
		return gcResult{}, err
	}
	if err := r.Close(); err != nil {
		return gcResult{}, err
	}
	if err := errors.Join(<-runDone, <-publishing); err != nil {
		return gcResult{}, err
	}
	ph.print(os.Stderr, fmt.Sprintf("prefetch %d, MaxBatch %d", gc.prefetch, gcMaxBatch(gc)))
	res.handled = float64(gc.n) / elapsed.Seconds()
	res.healthy = res.handled
	if at := time.Duration(healthyAt.Load()); at > 0 {
		res.healthy = float64(healthy) / at.Seconds()
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return gcResult{}, err
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[int64])
			if m.Name != "sluice.inbox.batch.size" || !ok {
				continue
			}
			for _, dp := range h.DataPoints {
				res.batches += int64(dp.Count)
				res.batched += dp.Sum
				if mx, ok := dp.Max.Value(); ok {
					res.maxBatch = max(res.maxBatch, mx)
				}
			}
		}
	}
	return res, nil
}

// gcPublishPaced publishes msgs one by one at rate per second, each stamped
// with the time its publish began.
func gcPublishPaced(pub *rabbitmq.Publisher, queue string, msgs []*message.Message, rate float64) error {
	t0 := time.Now()
	for i, m := range msgs {
		if d := time.Until(t0.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
		m.Metadata.Set(gcPublishedKey, strconv.FormatInt(time.Now().UnixNano(), 10))
		if err := pub.Publish(queue, m); err != nil {
			return err
		}
	}
	return nil
}

// gcMeanBatch is the mean size of the group commits, "—" without any.
func gcMeanBatch(batches, batched int64) string {
	if batches == 0 {
		return "—"
	}
	return strconv.FormatFloat(float64(batched)/float64(batches), 'f', 1, 64)
}

// gcMaxBatch is gc's batch handler's MaxBatch, 0 without one.
func gcMaxBatch(gc gcCase) int {
	if gc.batchHandler == nil {
		return 0
	}
	return gc.batchHandler.MaxBatch
}
