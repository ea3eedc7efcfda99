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
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// EndToEnd prints P1 and P2: a queue preloaded with messages, consumed on
// RabbitMQ with 1, 4 and 8 competing consumers, each message one business
// INSERT in PostgreSQL:
//
//	no inbox:      a bare watermill-amqp consumer, the INSERT in its own transaction;
//	inbox by hand: the same consumer doing what a careful engineer writes
//	               without Sluice: claim INSERT ... ON CONFLICT + business
//	               INSERT in one transaction, ack after commit;
//	sluice:        the full stack (Trace, Poison, Retry, Classify, Inbox,
//	               Recoverer) around the business INSERT, on watermill-amqp's
//	               subscriber (one delivery at a time per consumer);
//	sluice, Consumer: the same stack on Sluice's Consumer, the consumers
//	               being subscriptions of 16 deliveries in flight each;
//	no-op, Consumer: Sluice's Consumer with a handler that does nothing:
//	               where the broker (and the machine) is the ceiling;
//	PG ceiling:    the inbox-by-hand transaction in a loop, no broker.
func EndToEnd(ctx context.Context, o Options) error {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench_e2e", 24, nil)
	if err != nil {
		return err
	}
	defer cleanup()
	db.SetMaxIdleConns(24)
	v, err := newInboxVariants(ctx, db, schema)
	if err != nil {
		return err
	}
	conn, pub, closeBroker, err := dialBroker(o)
	if err != nil {
		return err
	}
	defer closeBroker()

	n := o.Messages * 4
	rounds := max(o.Rounds/4, 3)
	names := []string{"no inbox", "inbox by hand", "sluice", "sluice, Consumer", "no-op, Consumer"}
	var rows [][]string
	for _, conc := range []int{1, 4, 8} {
		rates := make([][]float64, len(names)+1)
		for round := range rounds {
			for k := range names {
				i := (k + round) % len(names)
				if err := v.truncate(ctx); err != nil {
					return err
				}
				r, err := consumeRun(ctx, conn, pub, o.AMQPURL, v, i, conc, n, fmt.Sprintf("c%d-r%d-", conc, round))
				if err != nil {
					return fmt.Errorf("%s: %w", names[i], err)
				}
				rates[i] = append(rates[i], r)
			}
			if err := v.truncate(ctx); err != nil {
				return err
			}
			r, err := Throughput(ctx, conc, n, v.byHand(fmt.Sprintf("ceiling-c%d-r%d-", conc, round)))
			if err != nil {
				return err
			}
			rates[len(names)] = append(rates[len(names)], r)
		}
		ceiling := rates[len(names)]
		row := []string{strconv.Itoa(conc)}
		for i := range names {
			row = append(row, f0(Median(rates[i])))
		}
		rows = append(rows, append(row, f0(Median(ceiling)),
			f2(MedianRatio(rates[2], rates[1])), f2(MedianRatio(rates[2], ceiling)), f2(MedianRatio(rates[3], rates[2])), f2(MedianRatio(rates[3], ceiling))))
	}
	fmt.Fprintf(o.Out, "P1/P2: end to end on RabbitMQ + PostgreSQL, %d messages preloaded per run, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"consumers", "no inbox msg/s", "inbox by hand msg/s", "sluice msg/s", "sluice, Consumer msg/s", "no-op, Consumer msg/s", "PG ceiling msg/s",
		"sluice ÷ by hand", "sluice ÷ ceiling", "Consumer ÷ watermill-amqp", "sluice, Consumer ÷ ceiling"}, rows)
	fmt.Fprintln(o.Out, "targets: sluice ÷ by hand ≥ 0.9 (P1); sluice ÷ PostgreSQL ceiling ≥ 0.7 (P2); no-op, Consumer is the broker's ceiling on this machine")
	return nil
}

// consumeRun preloads n messages into a fresh queue and returns the rate at
// which conc consumers of variant drain it.
func consumeRun(ctx context.Context, conn *amqp.Connection, pub *rabbitmq.Publisher, url string, v *inboxVariants, variant, conc, n int, run string) (float64, error) {
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: fmt.Sprintf("sluice_bench_e2e_%d", time.Now().UnixNano())})
	if err != nil {
		return 0, err
	}
	if _, err := topo.Declare(ctx, conn); err != nil {
		return 0, err
	}
	defer deleteTopology(conn, topo)
	for i := 0; i < n; i += 500 {
		batch := make([]*message.Message, 0, 500)
		for j := i; j < min(i+500, n); j++ {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(sluice.EventIDKey, run+strconv.Itoa(j))
			batch = append(batch, m)
		}
		if err := pub.Publish(topo.Config().Queue, batch...); err != nil {
			return 0, err
		}
	}

	var done atomic.Int64
	finished := make(chan struct{})
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && done.Add(1) == int64(n) {
				close(finished)
			}
			return out, err
		}
	}
	sub, err := newSubscriber(url, variant >= 3, 0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Close() }()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	r.AddMiddleware(count)
	key := func(msg *message.Message) string { return msg.Metadata.Get(sluice.EventIDKey) }
	switch variant {
	case 0, 1:
		handle := map[int]func(context.Context, string) error{0: v.plainKey, 1: v.byHandKey}[variant]
		for i := range conc {
			r.AddConsumerHandler("bench-"+strconv.Itoa(i), topo.Config().Queue, sub, func(msg *message.Message) error {
				return handle(msg.Context(), key(msg))
			})
		}
	case 4:
		for i := range conc {
			r.AddConsumerHandler("bench-"+strconv.Itoa(i), topo.Config().Queue, sub, func(*message.Message) error { return nil })
		}
	case 2, 3:
		_, err := router.Add(r, router.HandlerConfig{
			Name: "bench", Topic: topo.Config().Queue, Subscriber: sub, Consumers: conc,
			Handler: func(msg *message.Message) error {
				_, err := sluicesql.TxFromContext(msg.Context()).ExecContext(msg.Context(), v.insertBiz, key(msg))
				return err
			},
			Stages: router.Stages{
				Trace:     &stage.TraceConfig{},
				Poison:    &poison.Config{Publisher: pub, Topic: topo.Config().PoisonQueue},
				Retry:     &retrytiers.Config{Publisher: pub, Tiers: topo.Tiers()},
				Classify:  &stage.ClassifyConfig{},
				Inbox:     &deduplication.Config{Store: v.store, Consumer: "inventory"},
				Recoverer: &stage.RecovererConfig{},
			},
		})
		if err != nil {
			return 0, err
		}
	}
	return runRouter(ctx, r, finished, n)
}

// runRouter runs r until finished is closed (at most 5 minutes), closes it,
// and returns n divided by the time it ran.
func runRouter(ctx context.Context, r *message.Router, finished <-chan struct{}, n int) (float64, error) {
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-finished:
	case err := <-runErr:
		return 0, fmt.Errorf("router stopped: %w", err)
	case <-time.After(5 * time.Minute):
		_ = r.Close()
		return 0, errors.New("run did not finish in 5 minutes")
	}
	rate := float64(n) / time.Since(start).Seconds()
	if err := r.Close(); err != nil {
		return 0, err
	}
	return rate, <-runErr
}
