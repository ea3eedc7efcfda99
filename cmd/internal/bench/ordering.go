package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

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

// orderKeyHeader carries a bench message's ordering key.
const orderKeyHeader = "account"

// orderKeys is how many keys the ordering suite spreads its load over.
const orderKeys = 100

// orderCase is one run of the ordering suite: the full stack (Poison,
// Retry, Classify, Inbox on PostgreSQL, Recoverer; with Stages.Order when
// ordered) on Sluice's Consumer (one subscription, 16 in flight), over a
// fresh queue preloaded with n messages spread round robin over orderKeys
// keys, one business INSERT per delivery in the inbox's transaction.
type orderCase struct {
	n       int
	ordered bool
	// hot > 0: every hot-th message belongs to one more key, the hot key;
	// the run is timed until every other key's messages are handled.
	hot int
	// blocked: the hot key waits for a head that never comes (as one whose
	// head is in a retry tier or the poison queue): its messages are held.
	blocked bool
}

// Ordering prints P9: (a) the ordering mode's throughput ÷ the unordered
// stack's on the same load, and (b) the throughput of the keys that do not
// wait while one key is blocked ÷ while none is, the blocked key taking 1%
// and 10% of the load; then what the ordering stage adds to each delivery.
func Ordering(ctx context.Context, o Options) error {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench_order", 40, nil)
	if err != nil {
		return err
	}
	defer cleanup()
	db.SetMaxIdleConns(40)
	v, err := newInboxVariants(ctx, db, schema)
	if err != nil {
		return err
	}
	stores, err := sluicesql.New(db, sluicesql.Config{Schema: schema, Order: sluicesql.OrdersConfig{TablePrefix: "order"}})
	if err != nil {
		return err
	}
	store := stores.Order
	if err := stores.Migrate(ctx); err != nil {
		return err
	}
	reset := func(ctx context.Context) error {
		if err := v.truncate(ctx); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, "TRUNCATE "+schema+".order_keys, "+schema+".order_held")
		return err
	}
	n := o.Messages * 4
	rounds := max(o.Rounds/4, 3)
	// Each run on a connection of its own: a run that loses its broker (a
	// restart by another job on a shared machine) leaves the next ones theirs.
	run := func(oc orderCase, id string) (float64, error) {
		conn, pub, closeBroker, err := dialBroker(o)
		if err != nil {
			return 0, err
		}
		defer closeBroker()
		return orderRun(ctx, conn, pub, o.AMQPURL, v, store, oc, id)
	}

	cases := []orderCase{{n: n}, {n: n, ordered: true}}
	rates, err := rotate(ctx, rounds, len(cases), reset, func(round, i int) (float64, error) {
		return run(cases[i], fmt.Sprintf("a%d-r%d-", i, round))
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "P9: order per key, the full stack on Sluice's Consumer (1 subscription, prefetch %d), inbox on PostgreSQL, %d messages over %d keys preloaded, %d rounds interleaved\n\n",
		rabbitmqPrefetch, n, orderKeys, rounds)
	Table(o.Out, []string{"unordered msg/s", "ordered msg/s", "ordered ÷ unordered"},
		[][]string{{f0(Median(rates[0])), f0(Median(rates[1])), f2(MedianRatio(rates[1], rates[0]))}})
	fmt.Fprintln(o.Out)

	var rows [][]string
	for _, hot := range []int{100, 10} {
		cases := []orderCase{{n: n, ordered: true, hot: hot}, {n: n, ordered: true, hot: hot, blocked: true}}
		rates, err := rotate(ctx, rounds, len(cases), reset, func(round, i int) (float64, error) {
			return run(cases[i], fmt.Sprintf("b%d-%d-r%d-", hot, i, round))
		})
		if err != nil {
			return err
		}
		rows = append(rows, []string{fmt.Sprintf("%d%%", 100/hot), f0(Median(rates[0])), f0(Median(rates[1])), f2(MedianRatio(rates[1], rates[0]))})
	}
	fmt.Fprintf(o.Out, "P9: one key blocked (its head waiting, its messages held), the others' throughput; the same stack with Stages.Order\n\n")
	Table(o.Out, []string{"blocked key's share of the load", "none blocked: others msg/s", "one blocked: others msg/s", "one blocked ÷ none"}, rows)
	fmt.Fprintln(o.Out, "target: one blocked ÷ none ≥ 0.9")
	fmt.Fprintln(o.Out)

	// Where the cost goes: the stage's own store work on a delivery whose
	// key does not wait (Peeker.Waits: one statement), and a waiting key's
	// lock (a transaction), each alone at the consumer's 16 in flight,
	// beside the inbox's transaction (claim + business INSERT + commit).
	if err := reset(ctx); err != nil {
		return err
	}
	ops := []func(run string) Op{
		func(run string) Op {
			return func(ctx context.Context, i int) error {
				_, err := store.Waits(ctx, "bench", run+strconv.Itoa(i))
				return err
			}
		},
		func(run string) Op { return lockOnly(store, run) },
		v.sluice(v.mw),
	}
	costs, err := rotate(ctx, rounds, len(ops), nil, func(round, i int) (float64, error) {
		return Throughput(ctx, rabbitmqPrefetch, n, ops[i](fmt.Sprintf("c%d-%d-", round, i)))
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "P9: the ordering stage's store work alone, %d concurrent: a key that does not wait (Waits: one SELECT), a waiting key's lock (BEGIN, SET LOCAL lock_timeout, SELECT … FOR UPDATE, ROLLBACK), beside the inbox's transaction\n\n", rabbitmqPrefetch)
	row := []string{}
	for _, c := range costs {
		row = append(row, f0(Median(c)), f0(1e6*rabbitmqPrefetch/Median(c)))
	}
	Table(o.Out, []string{"Waits ops/s", "µs each", "key lock ops/s", "µs each", "inbox transaction ops/s", "µs each"}, [][]string{row})
	return nil
}

// lockOnly is the ordering stage's store work on a waiting key's delivery,
// less the steps that follow: lock the key (a transaction), read it, roll
// back.
func lockOnly(store ordering.Store, run string) Op {
	return func(ctx context.Context, i int) error {
		g, err := store.Lock(ctx, "bench", run+strconv.Itoa(i))
		if err != nil {
			return err
		}
		if _, _, err := g.State(ctx); err != nil {
			return errors.Join(err, g.Rollback(ctx))
		}
		return g.Rollback(ctx)
	}
}

// orderRun preloads oc's messages into a fresh queue and returns the rate
// at which the stack handles those not of the hot key (every message when
// there is none).
func orderRun(ctx context.Context, conn *amqp.Connection, pub *rabbitmq.Publisher, url string, v *inboxVariants, store ordering.Store, oc orderCase, run string) (float64, error) {
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: fmt.Sprintf("sluice_bench_order_%d", time.Now().UnixNano())})
	if err != nil {
		return 0, err
	}
	if _, err := topo.Declare(ctx, conn); err != nil {
		return 0, err
	}
	defer deleteTopology(conn, topo)
	hotKey := run + "hot"
	keyOf := func(i int) string {
		if oc.hot > 0 && i%oc.hot == oc.hot-1 {
			return hotKey
		}
		return run + "k" + strconv.Itoa(i%orderKeys)
	}
	counted := 0
	for i := range oc.n {
		if keyOf(i) != hotKey {
			counted++
		}
	}
	for i := 0; i < oc.n; i += 500 {
		batch := make([]*message.Message, 0, 500)
		for j := i; j < min(i+500, oc.n); j++ {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(sluice.EventIDKey, run+strconv.Itoa(j))
			m.Metadata.Set(orderKeyHeader, keyOf(j))
			batch = append(batch, m)
		}
		if err := pub.Publish(topo.Config().Queue, batch...); err != nil {
			return 0, err
		}
	}
	const name = "bench"
	if oc.blocked {
		if err := blockKey(ctx, store, name, hotKey, run+"head"); err != nil {
			return 0, err
		}
	}

	var done atomic.Int64
	finished := make(chan struct{})
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && msg.Metadata.Get(orderKeyHeader) != hotKey && done.Add(1) == int64(counted) {
				close(finished)
			}
			return out, err
		}
	}
	sub, err := newSubscriber(url, true, 0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Close() }()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	r.AddMiddleware(count)
	stages := router.Stages{
		Poison:    &poison.Config{Publisher: pub, Topic: topo.Config().PoisonQueue},
		Retry:     &retrytiers.Config{Publisher: pub, Tiers: topo.Tiers()},
		Classify:  &stage.ClassifyConfig{},
		Inbox:     &deduplication.Config{Store: v.store, Consumer: "inventory"},
		Recoverer: &stage.RecovererConfig{},
	}
	if oc.ordered {
		stages.Order = &ordering.Config{Store: store, Key: sluice.KeyFromMetadata(orderKeyHeader)}
	}
	if _, err := router.Add(r, router.HandlerConfig{
		Name: name, Topic: topo.Config().Queue, Subscriber: sub,
		Handler: func(msg *message.Message) error {
			_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), v.insertBiz, msg.Metadata.Get(sluice.EventIDKey))
			return err
		},
		Stages: stages,
	}); err != nil {
		return 0, err
	}
	rate, err := runRouter(ctx, r, finished, counted)
	if err != nil {
		return 0, err
	}
	if oc.blocked { // the hot key's messages were held, not applied
		var applied int
		if err := v.db.GetContext(ctx, &applied, "SELECT count(*) FROM "+v.schema+".reservations WHERE event_key IN (SELECT event_id FROM "+v.schema+".order_held)"); err != nil {
			return 0, err
		}
		if applied > 0 {
			return 0, fmt.Errorf("%d messages of the blocked key were applied", applied)
		}
	}
	return rate, nil
}

// blockKey makes key wait for head, as a key whose head went to a retry
// tier does.
func blockKey(ctx context.Context, store ordering.Store, consumer, key, head string) error {
	g, err := store.Lock(ctx, consumer, key)
	if err != nil {
		return err
	}
	defer func() { _ = g.Rollback(ctx) }()
	if err := g.Block(ctx, head, false, "bench: a head that never comes back"); err != nil {
		return err
	}
	return g.Commit(ctx)
}
