package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
)

// Outbox prints the transactional outbox's two comparisons: the relay's
// throughput (outboxRelay) and the full stack producing one message per
// delivery through it (outboxStack).
func Outbox(ctx context.Context, o Options) error {
	if err := outboxRelay(ctx, o); err != nil {
		return err
	}
	fmt.Fprintln(o.Out)
	return outboxStack(ctx, o)
}

// outboxRelay drains o.Messages*20 rows of 1 KiB messages, written into an
// outbox table on PostgreSQL beforehand, to a durable RabbitMQ queue, and
// compares, interleaved round after round:
//
//	relay:     Sluice's outbox.Relay (sluicesql.Outbox, rabbitmq's confirmed
//	           Publisher) with BatchSize 100 and 500, timed from its start
//	           (its first read) to the last row confirmed and deleted; and
//	           with Concurrency 4 and 2 (batches in flight at once);
//	direct:    the same messages published by the same Publisher, one
//	           Publish per batch of the same size: the relay's ceiling;
//	watermill: watermill-sql's publisher (the rows written through
//	           Watermill's forwarder publisher) relayed by Watermill's
//	           forwarder from watermill-sql's PostgreSQL subscriber
//	           (SubscribeBatchSize 100) to the same Publisher, timed from
//	           the forwarder's start to the last message confirmed.
func outboxRelay(ctx context.Context, o Options) error {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench_outbox", 8, nil)
	if err != nil {
		return err
	}
	defer cleanup()
	store, pub, admin, closeEnv, err := outboxEnv(ctx, o, db, schema)
	if err != nil {
		return err
	}
	defer closeEnv()
	queue := fmt.Sprintf("sluice_bench_outbox_%d", time.Now().UnixNano())
	if err := admin.declare(queue); err != nil {
		return err
	}
	defer admin.delete(queue)

	n := o.Messages * 20
	rounds := max(o.Rounds/4, 1)
	payload := make([]byte, 1024)
	msgs := func(run string) []*message.Message {
		ms := make([]*message.Message, n)
		for i := range ms {
			ms[i] = message.NewMessage(watermill.NewUUID(), payload)
			ms[i].Metadata.Set(sluice.EventIDKey, run+strconv.Itoa(i))
		}
		return ms
	}
	type variant struct {
		name string
		run  func(round int, ms []*message.Message) (float64, error)
	}
	times := map[string]*batchTimes{}
	relay := func(batch, concurrency int) func(int, []*message.Message) (float64, error) {
		return func(_ int, ms []*message.Message) (float64, error) {
			if err := writeOutbox(ctx, db, store, queue, ms); err != nil {
				return 0, err
			}
			r, t, err := relayRun(ctx, store, pub, batch, concurrency, len(ms))
			if concurrency == 1 {
				times[fmt.Sprint("relay", batch)].add(t)
			}
			return r, err
		}
	}
	direct := func(batch int) func(int, []*message.Message) (float64, error) {
		return func(_ int, ms []*message.Message) (float64, error) {
			t := times[fmt.Sprint("direct", batch)]
			start := time.Now()
			for chunk := range slices.Chunk(ms, batch) {
				s := time.Now()
				if err := pub.Publish(queue, chunk...); err != nil {
					return 0, err
				}
				t.publish = append(t.publish, time.Since(s))
			}
			t.wall += time.Since(start)
			return float64(len(ms)) / time.Since(start).Seconds(), nil
		}
	}
	for _, b := range []int{100, 500} {
		times[fmt.Sprint("relay", b)], times[fmt.Sprint("direct", b)] = &batchTimes{}, &batchTimes{}
	}
	variants := []variant{
		{"sluice relay, BatchSize 100", relay(100, 1)},
		{"direct Publish, batches of 100", direct(100)},
		{"sluice relay, BatchSize 500", relay(500, 1)},
		{"direct Publish, batches of 500", direct(500)},
		{"watermill-sql + forwarder", func(_ int, ms []*message.Message) (float64, error) {
			return forwarderRun(ctx, db, schema, pub, queue, fmt.Sprintf("outbox_%d", time.Now().UnixNano()), ms)
		}},
		{"sluice relay, BatchSize 100, Concurrency 4", relay(100, 4)},
		{"sluice relay, BatchSize 500, Concurrency 2", relay(500, 2)},
	}
	rates := make([][]float64, len(variants))
	for round := range rounds {
		for k := range variants {
			i := (k + round) % len(variants)
			if err := admin.do(func(ch *amqp.Channel) error { _, err := ch.QueuePurge(queue, false); return err }); err != nil {
				return fmt.Errorf("purging %s: %w", queue, err)
			}
			r, err := variants[i].run(round, msgs(fmt.Sprintf("r%d-v%d-", round, i)))
			if err != nil && ctx.Err() == nil {
				// A run disrupted (a chaos run on the shared broker closes
				// connections) is run once more, afresh.
				fmt.Fprintf(os.Stderr, "sluice-bench: outbox: %s: %v; running it again\n", variants[i].name, firstLine(err))
				err = errors.Join(admin.do(func(ch *amqp.Channel) error { _, err := ch.QueuePurge(queue, false); return err }),
					func() error { _, err := db.ExecContext(ctx, "TRUNCATE "+schema+".outbox"); return err }())
				if err == nil {
					r, err = variants[i].run(round, msgs(fmt.Sprintf("r%d-v%d-again-", round, i)))
				}
			}
			if err != nil {
				return fmt.Errorf("%s: %s", variants[i].name, firstLine(err))
			}
			rates[i] = append(rates[i], r)
		}
	}
	fmt.Fprintf(o.Out, "Outbox relay: %d rows of 1 KiB on PostgreSQL drained to a durable RabbitMQ queue with confirms, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"relay", "msg/s", "relay ÷ direct, same batch", "sluice relay ÷ it"}, [][]string{
		{variants[0].name, f0(Median(rates[0])), f2(MedianRatio(rates[0], rates[1])), ""},
		{variants[1].name, f0(Median(rates[1])), "", ""},
		{variants[2].name, f0(Median(rates[2])), f2(MedianRatio(rates[2], rates[3])), ""},
		{variants[3].name, f0(Median(rates[3])), "", ""},
		{variants[4].name, f0(Median(rates[4])), "", f2(MedianRatio(rates[0], rates[4])) + " (BatchSize 100), " + f2(MedianRatio(rates[2], rates[4])) + " (500)"},
		{variants[5].name, f0(Median(rates[5])), f2(MedianRatio(rates[5], rates[1])), ""},
		{variants[6].name, f0(Median(rates[6])), f2(MedianRatio(rates[6], rates[3])), ""},
	})
	fmt.Fprintln(o.Out, "target: relay ÷ direct ≥ 0.8 (the relay costs little over publishing the same messages with the same publisher)")
	fmt.Fprintln(o.Out, "\nWhere a batch's time goes, mean (median) over every batch of every round; \"rest\" is the runs' time outside the three, per batch:")
	var trows [][]string
	for _, b := range []int{100, 500} {
		r, d := times[fmt.Sprint("relay", b)], times[fmt.Sprint("direct", b)]
		rest := r.wall - totalDuration(r.due) - totalDuration(r.publish) - totalDuration(r.finish)
		trows = append(trows, []string{strconv.Itoa(b), meanMedian(r.due), meanMedian(r.publish), meanMedian(r.finish),
			msString(rest / time.Duration(max(len(r.due), 1))), meanMedian(d.publish), msString((d.wall - totalDuration(d.publish)) / time.Duration(max(len(d.publish), 1)))})
	}
	Table(o.Out, []string{"batch", "relay: Due (BEGIN, SELECT … SKIP LOCKED, decode)", "relay: publishes", "relay: Finish (DELETE, COMMIT)", "relay: rest",
		"direct: one Publish", "direct: rest"}, trows)
	return nil
}

func totalDuration(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

// meanMedian prints the mean of ds and, in parentheses, its median.
func meanMedian(ds []time.Duration) string {
	fs := make([]float64, len(ds))
	for i, d := range ds {
		fs[i] = float64(d)
	}
	mean := totalDuration(ds) / time.Duration(max(len(ds), 1))
	return fmt.Sprintf("%s (%s)", msString(mean), msString(time.Duration(Median(fs))))
}

// writeOutbox writes ms into the outbox, to topic, 500 rows a transaction.
func writeOutbox(ctx context.Context, db *sqlx.DB, store *sluicesql.Outbox, topic string, ms []*message.Message) error {
	for chunk := range slices.Chunk(ms, 500) {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		if err := store.Write(ctx, tx, topic, chunk...); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// outboxEnv creates the outbox table in schema and connects the confirmed
// publisher and the queue admin; closeEnv closes both.
func outboxEnv(ctx context.Context, o Options, db *sqlx.DB, schema string) (store *sluicesql.Outbox, pub *rabbitmq.Publisher, admin *amqpAdmin, closeEnv func(), err error) {
	stores, err := sluicesql.New(db, sluicesql.Config{Schema: schema, Outbox: sluicesql.OutboxConfig{Table: "outbox"}})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := stores.Migrate(ctx); err != nil {
		return nil, nil, nil, nil, err
	}
	store = stores.Outbox
	pub, err = rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: o.AMQPURL}})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	admin = &amqpAdmin{url: o.AMQPURL}
	return store, pub, admin, func() { admin.close(); _ = pub.Close() }, nil
}

// batchTimes are where a relay's batches spent their time: the store's Due
// (BEGIN, SELECT … FOR UPDATE SKIP LOCKED, decoding), the publishes (from
// Due's return to Finish's call) and Finish (DELETE, COMMIT); or, for the
// direct publisher, each Publish.
// wall is the runs' whole time, from the start to the last row deleted.
type batchTimes struct {
	due, publish, finish []time.Duration
	wall                 time.Duration
}

func (t *batchTimes) add(o batchTimes) {
	t.due, t.publish, t.finish = append(t.due, o.due...), append(t.publish, o.publish...), append(t.finish, o.finish...)
	t.wall += o.wall
}

// relayRun runs a relay on the outbox until n rows are relayed and deleted
// and returns n per second from its start, and its batches' times.
func relayRun(ctx context.Context, store outbox.Store, pub message.Publisher, batch, concurrency, n int) (float64, batchTimes, error) {
	counted := newCountingStore(store, n)
	r, err := outbox.NewRelay(counted, pub, outbox.RelayConfig{BatchSize: batch, Concurrency: concurrency})
	if err != nil {
		return 0, batchTimes{}, err
	}
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.WithoutCancel(ctx)) }()
	err = counted.wait(ctx, 5*time.Minute)
	if err = errors.Join(err, r.Close(), <-runErr); err != nil {
		return 0, batchTimes{}, err
	}
	counted.mu.Lock()
	defer counted.mu.Unlock()
	wall := counted.end.Sub(start)
	return float64(n) / wall.Seconds(), batchTimes{counted.due, counted.publish, counted.finish, wall}, nil
}

// countingStore is an outbox.Store that notes when n rows were deleted (the
// end of their batches' Finish). It passes the store's wake-ups on.
type countingStore struct {
	outbox.Store
	n, done int
	mu      sync.Mutex
	end     time.Time
	all     chan struct{}
	// the time of each batch's Due, and of its Finish, and the time from
	// Due's return to Finish's call (the publishes), for the breakdown
	due, finish, publish []time.Duration
}

var _ outbox.Store = (*countingStore)(nil)

func newCountingStore(s outbox.Store, n int) *countingStore {
	return &countingStore{Store: s, n: n, all: make(chan struct{})}
}

func (c *countingStore) Due(ctx context.Context, limit int, maxBytes int64) (outbox.Batch, error) {
	start := time.Now()
	b, err := c.Store.Due(ctx, limit, maxBytes)
	if err != nil {
		return nil, err
	}
	taken := time.Now()
	if len(b.Rows()) > 0 {
		c.mu.Lock()
		c.due = append(c.due, taken.Sub(start))
		c.mu.Unlock()
	}
	return countingBatch{Batch: b, c: c, taken: taken}, nil
}

func (c *countingStore) finished(relayed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	before := c.done
	c.done += relayed
	if before < c.n && c.done >= c.n {
		c.end = time.Now()
		close(c.all)
	}
}

// wait waits until n rows were deleted, at most d.
func (c *countingStore) wait(ctx context.Context, d time.Duration) error {
	select {
	case <-c.all:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		c.mu.Lock()
		defer c.mu.Unlock()
		return fmt.Errorf("%d of %d rows relayed in %s", c.done, c.n, d)
	}
}

type countingBatch struct {
	outbox.Batch
	c     *countingStore
	taken time.Time
}

func (b countingBatch) Finish(ctx context.Context, relayed []int64, failed []outbox.Failed) error {
	start := time.Now()
	if err := b.Batch.Finish(ctx, relayed, failed); err != nil {
		return err
	}
	b.c.mu.Lock()
	b.c.publish = append(b.c.publish, start.Sub(b.taken))
	b.c.finish = append(b.c.finish, time.Since(start))
	b.c.mu.Unlock()
	b.c.finished(len(relayed))
	return nil
}
