package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/unitofwork"
)

// outboxStack compares, on RabbitMQ and PostgreSQL, a queue preloaded with
// o.Messages*8 messages consumed by the full stack (router.Add with Poison,
// Retry, Classify, Inbox, Recoverer on a rabbitmq.Broker; one business
// INSERT per message), with 1 and 4 subscriptions of Sluice's Consumer,
// interleaved round after round:
//
//	producing nothing: a Handler;
//	producing, relay on the inbox's pool: a PublishingHandler returning one
//	  message per delivery, written through HandlerConfig.Outbox, and an
//	  outbox.Relay (defaults: BatchSize 100, woken by the inbox's commits)
//	  on the same Store, so on the handlers' 24-connection pool;
//	producing, relay on its own pool: the same, the relay on a second Store
//	  of the same table on a pool of 2 connections, woken by the first's
//	  commits.
//
// A producing run is timed until the last produced message is confirmed
// (and, apart, until the last delivery's commit). For the producing runs it
// reports the latency from each delivery's inbox commit
// (unitofwork.OnCommit) to the return of the relay's PublishEach that
// carried its produced message (every confirm of that batch in), and the
// mean of the relay's sluice.outbox.lag histogram (from the row's write to
// its confirm) as a cross-check.
func outboxStack(ctx context.Context, o Options) error {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench_outbox_stack", 24, nil)
	if err != nil {
		return err
	}
	defer cleanup()
	db.SetMaxIdleConns(24)
	v, err := newInboxVariants(ctx, db, schema)
	if err != nil {
		return err
	}
	store, pub, admin, closeEnv, err := outboxEnv(ctx, o, db, schema)
	if err != nil {
		return err
	}
	defer closeEnv()
	truncate := func(ctx context.Context) error {
		if err := v.truncate(ctx); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, "TRUNCATE "+schema+".outbox")
		return err
	}

	// The relay on a pool of its own: a second Store on the same table,
	// woken by the writer's commits.
	relayDB, err := openPG(ctx, o.PostgresURL, nil)
	if err != nil {
		return err
	}
	defer func() { _ = relayDB.Close() }()
	relayDB.SetMaxOpenConns(2)
	ownStore, err := sluicesql.NewOutbox(relayDB, sluicesql.OutboxConfig{Table: schema + ".outbox"})
	if err != nil {
		return err
	}
	relayStores := []outbox.Store{nil, store, wakeFrom{Store: ownStore, w: store}}
	names := []string{"", "the inbox's (24)", "its own (2)"}

	n := o.Messages * 8
	rounds := max(o.Rounds/4, 1)
	var rows [][]string
	for _, consumers := range []int{1, 4} {
		var rates [3][]float64        // producing nothing; producing, the relay on the inbox's pool; on its own
		var handledRates [3][]float64 // producing, until the last commit
		var lat [3]*commitLatencies
		var lagSum [3]float64
		var lagCount [3]uint64
		for i := range lat {
			lat[i] = &commitLatencies{committed: map[string]time.Time{}}
		}
		for round := range rounds {
			for k := range 3 {
				i := (k + round) % 3
				if err := truncate(ctx); err != nil {
					return err
				}
				sc := stackCase{consumers: consumers, relayStore: relayStores[i], n: n, run: fmt.Sprintf("c%d-r%d-v%d-", consumers, round, i)}
				r, err := stackRun(ctx, admin, pub, o.AMQPURL, v, store, sc, lat[i])
				if err != nil && ctx.Err() == nil {
					// A run disrupted (a chaos run on the shared broker
					// closes connections) is run once more, afresh.
					fmt.Fprintf(os.Stderr, "sluice-bench: outbox: %d subscriptions, variant %d: %v; running it again\n", consumers, i, firstLine(err))
					if err = truncate(ctx); err == nil {
						sc.run += "again-"
						r, err = stackRun(ctx, admin, pub, o.AMQPURL, v, store, sc, lat[i])
					}
				}
				if err != nil {
					return fmt.Errorf("%d subscriptions, variant %d: %w", consumers, i, err)
				}
				rates[i] = append(rates[i], r.rate)
				handledRates[i] = append(handledRates[i], r.handledRate)
				lagSum[i] += r.lagSum
				lagCount[i] += r.lagCount
			}
		}
		for i := 1; i < 3; i++ {
			p50, p99 := lat[i].percentiles()
			nothing := ""
			if i == 1 {
				nothing = f0(Median(rates[0]))
			}
			rows = append(rows, []string{strconv.Itoa(consumers), nothing, names[i], f0(Median(rates[i])), f2(MedianRatio(rates[i], rates[0])),
				f0(Median(handledRates[i])), f2(MedianRatio(handledRates[i], rates[0])),
				msString(p50), msString(p99), strconv.Itoa(len(lat[i].samples)), msString(time.Duration(lagSum[i] / float64(max(lagCount[i], 1)) * float64(time.Second)))})
		}
	}
	fmt.Fprintf(o.Out, "Outbox in the full stack (Poison, Retry, Classify, Inbox, Recoverer) on RabbitMQ + PostgreSQL, %d messages preloaded per run, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"subscriptions (16 in flight each)", "producing nothing msg/s", "relay's pool (connections)", "one produced per delivery, relayed msg/s", "ratio",
		"producing, to the last commit msg/s", "ratio at the last commit",
		"commit → confirm p50", "p99", "samples", "relay's sluice.outbox.lag mean"}, rows)
	fmt.Fprintln(o.Out, "target: ratio ≥ 0.7; the producing run ends at the last produced message's confirm. commit → confirm: from the inbox's commit to the return of the relay's PublishEach for the batch carrying the message")
	return outboxCeiling(ctx, o, v, store, truncate, n, rounds)
}

// firstLine is err's first line: a publisher's joined errors, one per
// message, would fill the screen.
func firstLine(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

func msString(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + " ms"
}

// stackCase is one run of the outbox stack suite.
type stackCase struct {
	consumers int
	// relayStore is the relay's store when the handler produces through
	// the outbox (nil: it produces nothing)
	relayStore outbox.Store
	n          int
	run        string // prefix of the event ids
}

type stackResult struct {
	rate float64
	// handledRate is n per second until the last delivery's commit (in a
	// producing run, before the relay confirmed the last produced message)
	handledRate float64
	lagSum      float64 // seconds, the relay's histogram
	lagCount    uint64
}

func stackRun(ctx context.Context, admin *amqpAdmin, pub *rabbitmq.Publisher, url string, v *inboxVariants, store *sluicesql.Outbox, sc stackCase, lat *commitLatencies) (stackResult, error) {
	queue := fmt.Sprintf("sluice_bench_outbox_stack_%d", time.Now().UnixNano())
	rabbit, err := rabbitmq.NewBroker(ctx, rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: url}, Topology: rabbitmq.TopologyConfig{Queue: queue}})
	if err != nil {
		return stackResult{}, err
	}
	produced := queue + ".produced"
	defer func() {
		queues := []string{produced}
		for _, q := range rabbit.Topology().Plan().Queues {
			queues = append(queues, q.Name)
		}
		admin.delete(queues...)
	}()
	defer func() { _ = rabbit.Close() }()
	if err := admin.declare(produced); err != nil {
		return stackResult{}, err
	}
	for i := 0; i < sc.n; i += 500 {
		batch := make([]*message.Message, 0, 500)
		for j := i; j < min(i+500, sc.n); j++ {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(sluice.EventIDKey, sc.run+strconv.Itoa(j))
			batch = append(batch, m)
		}
		if err := pub.Publish(queue, batch...); err != nil {
			return stackResult{}, err
		}
	}

	var handled, confirmed atomic.Int64
	var lastCommit atomic.Int64 // UnixNano of the n-th handled delivery
	finished := make(chan struct{})
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && handled.Add(1) == int64(sc.n) {
				lastCommit.Store(time.Now().UnixNano())
				if sc.relayStore == nil {
					close(finished)
				}
			}
			return out, err
		}
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return stackResult{}, err
	}
	r.AddMiddleware(count)
	insert := func(msg *message.Message) error {
		_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), v.insertBiz, msg.Metadata.Get(sluice.EventIDKey))
		return err
	}
	cfg := router.HandlerConfig{
		Name: "bench", Broker: rabbit, Consumers: sc.consumers,
		Stages: router.Stages{
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: v.store},
			Recoverer: &stage.RecovererConfig{},
		},
	}
	var relay *outbox.Relay
	reader := sdkmetric.NewManualReader()
	relayErr := make(chan error, 1)
	if sc.relayStore == nil {
		cfg.Handler = insert
	} else {
		cfg.Outbox, cfg.PublishTopic = store, produced
		cfg.PublishingHandler = func(msg *message.Message) ([]*message.Message, error) {
			if err := insert(msg); err != nil {
				return nil, err
			}
			evt := message.NewMessage(watermill.NewUUID(), []byte(`{"reserved":true}`))
			id := "reserved:" + msg.Metadata.Get(sluice.EventIDKey)
			evt.Metadata.Set(sluice.EventIDKey, id)
			unitofwork.OnCommit(msg.Context(), func() { lat.commit(id) })
			return []*message.Message{evt}, nil
		}
		timed := &timedPublisher{pub: rabbit.Publisher(), lat: lat, n: int64(sc.n), all: finished, done: &confirmed}
		relay, err = outbox.NewRelay(sc.relayStore, timed, outbox.RelayConfig{Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}})
		if err != nil {
			return stackResult{}, err
		}
		go func() { relayErr <- relay.Run(context.WithoutCancel(ctx)) }()
	}
	if _, err := router.Add(r, cfg); err != nil {
		return stackResult{}, errors.Join(err, closeRelay(relay, relayErr))
	}
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-finished:
	case err = <-runErr:
		err = fmt.Errorf("router stopped: %w", err)
	case <-time.After(2 * time.Minute):
		err = fmt.Errorf("run did not finish in 2 minutes: %d of %d deliveries handled, %d produced messages confirmed", handled.Load(), sc.n, confirmed.Load())
	}
	if err != nil {
		_ = r.Close()
		return stackResult{}, errors.Join(err, closeRelay(relay, relayErr))
	}
	res := stackResult{rate: float64(sc.n) / time.Since(start).Seconds()}
	res.handledRate = float64(sc.n) / time.Unix(0, lastCommit.Load()).Sub(start).Seconds()
	if err := errors.Join(r.Close(), <-runErr, closeRelay(relay, relayErr)); err != nil {
		return stackResult{}, err
	}
	if relay != nil {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			return stackResult{}, err
		}
		for _, s := range rm.ScopeMetrics {
			for _, m := range s.Metrics {
				if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "sluice.outbox.lag" {
					for _, dp := range h.DataPoints {
						res.lagSum += dp.Sum
						res.lagCount += dp.Count
					}
				}
			}
		}
	}
	return res, nil
}

func closeRelay(r *outbox.Relay, done <-chan error) error {
	if r == nil {
		return nil
	}
	return errors.Join(r.Close(), <-done)
}

// commitLatencies pairs each produced message's inbox commit with its confirm.
type commitLatencies struct {
	mu        sync.Mutex
	committed map[string]time.Time
	samples   []time.Duration
}

func (l *commitLatencies) commit(id string) {
	now := time.Now()
	l.mu.Lock()
	l.committed[id] = now
	l.mu.Unlock()
}

func (l *commitLatencies) confirmed(ids []string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if c, ok := l.committed[id]; ok {
			l.samples = append(l.samples, at.Sub(c))
			delete(l.committed, id)
		}
	}
}

func (l *commitLatencies) percentiles() (p50, p99 time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) == 0 {
		return 0, 0
	}
	s := slices.Clone(l.samples)
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)*99/100, len(s)-1)]
}

// timedPublisher is the relay's publisher: rabbitmq's, its PublishEach
// timed; it closes all once n messages were confirmed.
type timedPublisher struct {
	pub  *rabbitmq.Publisher
	lat  *commitLatencies
	n    int64
	done *atomic.Int64
	all  chan struct{}
}

var _ broker.EachPublisher = (*timedPublisher)(nil)

func (p *timedPublisher) PublishEach(topic string, msgs ...*message.Message) []error {
	errs := p.pub.PublishEach(topic, msgs...)
	now := time.Now()
	ids := make([]string, 0, len(msgs))
	for i, m := range msgs {
		if i < len(errs) && errs[i] == nil {
			ids = append(ids, m.Metadata.Get(sluice.EventIDKey))
		}
	}
	p.lat.confirmed(ids, now)
	if d := p.done.Add(int64(len(ids))); d >= p.n && d-int64(len(ids)) < p.n {
		close(p.all)
	}
	return errs
}

func (p *timedPublisher) Publish(topic string, msgs ...*message.Message) error {
	return errors.Join(p.PublishEach(topic, msgs...)...)
}

func (p *timedPublisher) Close() error { return nil }

// wakeFrom is a Store woken by another's commits: a relay on a pool of its
// own, woken by the inbox's writes on the handlers' pool.
type wakeFrom struct {
	outbox.Store
	w outbox.Store
}

func (w wakeFrom) Wakeups() <-chan struct{} { return w.w.Wakeups() }

// outboxCeiling prints what PostgreSQL alone gives the outbox, no broker and
// no stack: the inbox transaction by hand (claim, business INSERT, commit)
// against the same with one produced message written by the outbox store's
// Write in it, while one drainer takes the rows as a relay does (Due of
// BatchSize rows, Finish of all: SELECT … FOR UPDATE SKIP LOCKED, DELETE)
// without publishing them, timed until the last row is gone; at 16 and 64
// transactions side by side. The ratio bounds the stack's producing ÷
// producing nothing on this machine.
func outboxCeiling(ctx context.Context, o Options, v *inboxVariants, store *sluicesql.Outbox, truncate func(context.Context) error, n, rounds int) error {
	var rows [][]string
	for _, conc := range []int{rabbitmqPrefetch, 4 * rabbitmqPrefetch} {
		rates, err := rotate(ctx, rounds, 2, truncate, func(round, i int) (float64, error) {
			run := fmt.Sprintf("ceiling-c%d-r%d-v%d-", conc, round, i)
			if i == 0 {
				return Throughput(ctx, conc, n, v.byHand(run))
			}
			return producingByHand(ctx, v, store, conc, n, run)
		})
		if err != nil {
			return fmt.Errorf("the outbox's ceiling, %d side by side: %w", conc, err)
		}
		rows = append(rows, []string{strconv.Itoa(conc), f0(Median(rates[0])), f0(Median(rates[1])), f2(MedianRatio(rates[1], rates[0]))})
	}
	fmt.Fprintf(o.Out, "\nThe outbox's ceiling: PostgreSQL alone (no broker, no stack), %d deliveries per run, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"transactions side by side", "inbox by hand msg/s", "+ one produced row, drained as a relay does msg/s", "ratio"}, rows)
	fmt.Fprintln(o.Out, "the ratio here bounds the full stack's producing ÷ producing nothing on this machine")
	return nil
}

// producingByHand runs n inbox transactions by hand on conc goroutines,
// each writing one produced message through store.Write, while one drainer
// deletes the rows as a relay does; it returns n ÷ the time until the last
// row is gone.
func producingByHand(ctx context.Context, v *inboxVariants, store *sluicesql.Outbox, conc, n int, run string) (float64, error) {
	start := time.Now()
	var drained atomic.Int64
	writersDone := make(chan struct{})
	drainErr := make(chan error, 1)
	dctx, cancel := context.WithCancel(ctx) // ends the drainer when a writer failed
	defer cancel()
	go func() {
		ctx := dctx
		for drained.Load() < int64(n) {
			b, err := store.Due(ctx, 500, 0) // the relay's default batch
			if err != nil {
				drainErr <- err
				return
			}
			ids := make([]int64, 0, len(b.Rows()))
			for _, r := range b.Rows() {
				ids = append(ids, r.ID)
			}
			if err := b.Finish(ctx, ids, nil); err != nil {
				drainErr <- err
				return
			}
			drained.Add(int64(len(ids)))
			if len(ids) == 0 {
				select {
				case <-writersDone:
					if drained.Load() < int64(n) {
						continue // the last commits may land after an empty read
					}
				case <-time.After(time.Millisecond): // a relay waits for a wake-up or its poll
				case <-ctx.Done():
					drainErr <- ctx.Err()
					return
				}
			}
		}
		drainErr <- nil
	}()
	_, err := Throughput(ctx, conc, n, func(ctx context.Context, i int) error {
		key := run + strconv.Itoa(i)
		tx, err := v.db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
		if _, err := tx.ExecContext(ctx, v.claimSQL, "inventory", key); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, v.insertBiz, key); err != nil {
			return err
		}
		evt := message.NewMessage(watermill.NewUUID(), []byte(`{"reserved":true}`))
		evt.Metadata.Set(sluice.EventIDKey, "reserved:"+key)
		if err := store.Write(ctx, tx, "produced", evt); err != nil {
			return err
		}
		return tx.Commit()
	})
	close(writersDone)
	if err != nil {
		cancel()
	}
	if derr := <-drainErr; err == nil {
		err = derr
	}
	if err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
