package bench

import (
	"cmp"
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
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// Consumer measures head-of-line blocking: a consumer on RabbitMQ behind
// poison → retrytiers → classify, with a queue preloaded with o.Messages*4
// messages, where 10% fail transiently on their first attempt (and are
// parked in the first default tier, 30s: they come back after the run, so
// what is measured is what parking them costs the healthy messages), against
// a run where all are healthy, with 1 and 8 subscriptions of watermill-amqp's
// subscriber (one delivery at a time per subscription) and, side by side,
// 1 subscription of Sluice's Consumer (16 deliveries in flight). It reports
// the rate at which the healthy messages are handled in both.
func Consumer(ctx context.Context, o Options) error {
	conn, pub, closeBroker, err := dialBroker(o)
	if err != nil {
		return err
	}
	defer closeBroker()

	n := o.Messages * 4
	rounds := max(o.Rounds/4, 3)
	var rows [][]string
	cases := []struct {
		work   time.Duration
		subs   int
		sluice bool
	}{
		{0, 1, false}, {0, 8, false}, {time.Millisecond, 1, false}, {time.Millisecond, 8, false}, {3 * time.Millisecond, 8, false},
		{0, 1, true}, {time.Millisecond, 1, true}, {3 * time.Millisecond, 1, true},
	}
	for _, cs := range cases {
		var rates [2][]float64 // all healthy, 10% failing
		for round := range rounds {
			for k := range 2 {
				failing := (k+round)%2 == 1
				r, err := consumerRun(ctx, conn, pub, o.AMQPURL, consumerCase{n: n, subs: cs.subs, work: cs.work, failing: failing, sluice: cs.sluice, prefetch: o.Prefetch})
				if err != nil {
					return err
				}
				rates[btoi(failing)] = append(rates[btoi(failing)], r)
			}
		}
		kind := "watermill-amqp"
		if cs.sluice {
			kind = fmt.Sprintf("sluice Consumer (prefetch %d)", cmp.Or(o.Prefetch, rabbitmqPrefetch))
		}
		rows = append(rows, []string{kind, cs.work.String(), strconv.Itoa(cs.subs), f0(Median(rates[0])), f0(Median(rates[1])), f2(MedianRatio(rates[1], rates[0]))})
	}
	latency, err := confirmLatency(ctx, conn, pub)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "Consumer on RabbitMQ behind poison → retrytiers → classify, %d messages preloaded, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"subscriber", "handler work", "subscriptions", "all healthy msg/s", "10% transient msg/s (healthy ones)", "ratio"}, rows)
	fmt.Fprintf(o.Out, "confirm latency of one persistent message, nothing else in flight: median %s\n", latency.Round(10*time.Microsecond))
	fmt.Fprintln(o.Out, "target: ≥ 0.9 (a failing message does not hold up the healthy ones); reached once a healthy message costs the handler more than parking a failure costs (a confirmed publish under load)")
	return nil
}

// consumerRun declares a fresh topology, preloads n messages and consumes
// them; it returns the healthy messages' rate.
// consumerCase is one run of the consumer suite.
type consumerCase struct {
	n, subs int
	work    time.Duration // simulated I/O per healthy message (time.Sleep)
	failing bool
	sluice  bool // Sluice's Consumer instead of watermill-amqp's subscriber
	// prefetch of Sluice's Consumer (0: its default)
	prefetch int
}

func consumerRun(ctx context.Context, conn *amqp.Connection, pub *rabbitmq.Publisher, url string, cc consumerCase) (float64, error) {
	n, subs, failing := cc.n, cc.subs, cc.failing
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{
		Queue: fmt.Sprintf("sluice_bench_consume_%d", time.Now().UnixNano()),
	})
	if err != nil {
		return 0, err
	}
	if _, err := topo.Declare(ctx, conn); err != nil {
		return 0, err
	}
	defer deleteTopology(conn, topo)

	healthy := n
	batch := make([]*message.Message, n)
	for i := range batch {
		batch[i] = message.NewMessage(watermill.NewUUID(), make([]byte, 256))
		batch[i].Metadata.Set(sluice.EventIDKey, strconv.Itoa(i))
		if failing && i%10 == 0 {
			batch[i].Metadata.Set("fail", "once")
			healthy--
		}
	}
	if err := pub.Publish(topo.Config().Queue, batch...); err != nil {
		return 0, err
	}

	var handled atomic.Int64
	done := make(chan struct{})
	errTransient := errors.New("downstream timeout")
	handler := func(msg *message.Message) error {
		if msg.Metadata.Get("fail") == "once" && msg.Metadata.Get(sluice.AttemptKey) == "" {
			return sluice.Transient(errTransient)
		}
		time.Sleep(cc.work)
		if msg.Metadata.Get("fail") == "" && handled.Add(1) == int64(healthy) {
			close(done)
		}
		return nil
	}
	mws, err := router.Middlewares(router.Stages{ // poison → retrytiers → classify, as router.Add assembles them
		ShutdownGrace: -1, Poison: &poison.Config{Publisher: pub, Topic: topo.Config().PoisonQueue},
		Retry: &retrytiers.Config{Publisher: pub, Tiers: topo.Tiers()}, Classify: &stage.ClassifyConfig{},
	})
	if err != nil {
		return 0, err
	}
	sub, err := newSubscriber(url, cc.sluice, cc.prefetch)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Close() }()
	rt, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	for i := range subs {
		rt.AddConsumerHandler("bench-"+strconv.Itoa(i), topo.Config().Queue, sub, handler).AddMiddleware(mws...)
	}

	start := time.Now()
	go func() { _ = rt.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		_ = rt.Close()
		return 0, errors.New("consumer run did not finish in 2 minutes")
	}
	rate := float64(healthy) / time.Since(start).Seconds()
	return rate, rt.Close()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func deleteTopology(conn *amqp.Connection, topo *rabbitmq.Topology) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer func() { _ = ch.Close() }()
	for _, q := range topo.Plan().Queues {
		_, _ = ch.QueueDelete(q.Name, false, false, false)
	}
}

// confirmLatency is the median time of 200 single-message confirmed
// publishes to a durable queue, one at a time.
func confirmLatency(ctx context.Context, conn *amqp.Connection, pub *rabbitmq.Publisher) (time.Duration, error) {
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: fmt.Sprintf("sluice_bench_latency_%d", time.Now().UnixNano()), TierDelays: []time.Duration{time.Second}})
	if err != nil {
		return 0, err
	}
	if _, err := topo.Declare(ctx, conn); err != nil {
		return 0, err
	}
	defer deleteTopology(conn, topo)
	ds := make([]float64, 200)
	for i := range ds {
		start := time.Now()
		if err := pub.Publish(topo.Config().Queue, message.NewMessage(watermill.NewUUID(), make([]byte, 256))); err != nil {
			return 0, err
		}
		ds[i] = float64(time.Since(start))
	}
	return time.Duration(Median(ds)), nil
}
