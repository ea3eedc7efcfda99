// Package bench holds the comparison benchmarks printed by cmd/sluice-bench.
// Each suite runs its variants interleaved, round after round, in one process,
// and reports medians and ratios: absolute numbers vary between machines and
// runs, ratios measured side by side much less.
package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/rabbitmq"
)

// Options are shared by the suites.
type Options struct {
	PostgresURL string
	AMQPURL     string
	// PublishBatch is the size of one batch in the publisher suite.
	PublishBatch int
	// ScaleRows is how many rows the inbox-scale suite loads.
	ScaleRows int
	// Messages per variant per round and concurrency level.
	Messages int
	// Rounds of every variant; the median is reported.
	Rounds int
	// Prefetch of Sluice's Consumer in the consumer suite (0: its default).
	Prefetch int
	Out      io.Writer
}

// Op processes message i of a run.
type Op func(ctx context.Context, i int) error

// Throughput runs n ops on conc goroutines and returns ops per second.
func Throughput(ctx context.Context, conc, n int, op Op) (float64, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := op(ctx, i); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("message %d: %w", i, err) })
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds(), firstErr
}

// Interleave runs o.Rounds rounds; each round runs every variant once with
// o.Messages messages on conc goroutines, rotating their order, after reset.
// It returns the rates of each variant, one per round.
func Interleave(ctx context.Context, o Options, conc, variants int, op func(round, variant int) Op, reset func(context.Context) error) ([][]float64, error) {
	return rotate(ctx, o.Rounds, variants, reset, func(round, v int) (float64, error) {
		return Throughput(ctx, conc, o.Messages, op(round, v))
	})
}

// rotate runs run(round, v) for each of variants, round after round, each
// round starting one variant later, after reset (nil: none). It returns
// each variant's results, one per round.
func rotate(ctx context.Context, rounds, variants int, reset func(context.Context) error, run func(round, v int) (float64, error)) ([][]float64, error) {
	results := make([][]float64, variants)
	for v := range results {
		results[v] = make([]float64, rounds)
	}
	for round := range rounds {
		for k := range variants {
			v := (k + round) % variants
			if reset != nil {
				if err := reset(ctx); err != nil {
					return nil, err
				}
			}
			r, err := run(round, v)
			if err != nil {
				return nil, fmt.Errorf("variant %d: %w", v, err)
			}
			results[v][round] = r
		}
	}
	return results, nil
}

// MedianRatio returns the median of num[i]/den[i]: ratios of runs made next
// to each other cancel out the machine's drift.
func MedianRatio(num, den []float64) float64 {
	r := make([]float64, len(num))
	for i := range num {
		r[i] = num[i] / den[i]
	}
	return Median(r)
}

// pgSchema connects to PostgreSQL with at most conns open connections
// (counting the writes to the server into writes, when set) and creates a
// schema named prefix plus a random suffix; cleanup drops the schema and
// closes the pool.
func pgSchema(ctx context.Context, url, prefix string, conns int, writes *atomic.Int64) (*sqlx.DB, string, func(), error) {
	db, err := openPG(ctx, url, writes)
	if err != nil {
		return nil, "", nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	db.SetMaxOpenConns(conns)
	schema := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		_ = db.Close()
		return nil, "", nil, err
	}
	return db, schema, func() {
		_, _ = db.ExecContext(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE")
		_ = db.Close()
	}, nil
}

// Median returns the median of xs.
func Median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs) == 0 {
		return 0
	}
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// Table writes rows as aligned columns.
func Table(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	line := func(cells []string) {
		for _, c := range cells {
			fmt.Fprint(tw, c, "\t")
		}
		fmt.Fprintln(tw)
	}
	line(header)
	for _, r := range rows {
		line(r)
	}
	_ = tw.Flush()
}

// dialBroker opens the suite's connection (declarations, reads) and the
// confirmed publisher; close closes both.
func dialBroker(o Options) (conn *amqp.Connection, pub *rabbitmq.Publisher, close func(), err error) {
	conn, err = rabbitmq.Dial(rabbitmq.Connection{URL: o.AMQPURL}, "sluice bench")
	if err != nil {
		return nil, nil, nil, fmt.Errorf("connecting to RabbitMQ: %w", err)
	}
	pub, err = rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: o.AMQPURL}})
	if err != nil {
		_ = conn.Close()
		return nil, nil, nil, err
	}
	return conn, pub, func() { _ = pub.Close(); _ = conn.Close() }, nil
}

// newSubscriber is Sluice's Consumer (prefetch 0: its default) or
// watermill-amqp's subscriber, as the variant says: the latter reads with
// Sluice's Marshaler (rabbitmq.WithMarshaler), the prefetch of
// rabbitmq.BrokerConfig's default (16), and declares nothing — the suite
// declared the queues.
func newSubscriber(url string, sluiceConsumer bool, prefetch int) (message.Subscriber, error) {
	if sluiceConsumer {
		return rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: url}, Prefetch: prefetch})
	}
	c := wamqp.NewDurableQueueConfig(url)
	c.Consume.Qos.PrefetchCount = rabbitmqPrefetch
	c.TopologyBuilder = declared{}
	c, err := rabbitmq.WithMarshaler(c)
	if err != nil {
		return nil, err
	}
	sub, err := wamqp.NewSubscriber(c, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	return sub, nil
}

// declared is the TopologyBuilder of a subscriber on queues the suite
// declared: it declares nothing.
type declared struct{}

func (declared) BuildTopology(*amqp.Channel, wamqp.BuildTopologyParams, wamqp.Config, watermill.LoggerAdapter) error {
	return nil
}

func (declared) ExchangeDeclare(*amqp.Channel, string, wamqp.Config) error { return nil }
