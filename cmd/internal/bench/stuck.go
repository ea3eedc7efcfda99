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
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// stuckCount is how many messages cannot be isolated in the stuck suite.
const stuckCount = 20

// Stuck measures whether messages that cannot reach their target starve the
// good ones: the poison queue is full (x-max-length 0, reject-publish) or
// the first of two tier queues is deleted, and 20 messages that must go
// there are preloaded ahead of the good ones. Before, the stage waited its
// publish backoff (1 s) holding the delivery and nacked it, and the broker
// requeued it at the head: 16 slots full of stuck messages. Now a refused
// poison copy is parked in the first tier and a refused retry copy waits in
// another tier. It reports the good messages' rate with the 20 stuck
// messages ÷ without, for Sluice's Consumer (16 deliveries in flight) and
// watermill-amqp's subscriber (4 subscriptions of one delivery each).
func Stuck(ctx context.Context, o Options) error {
	conn, pub, closeBroker, err := dialBroker(o)
	if err != nil {
		return err
	}
	defer closeBroker()

	good := o.Messages * 4
	rounds := max(o.Rounds/4, 3)
	var rows [][]string
	for _, target := range []string{"poison queue full", "tier queue deleted"} {
		for _, sluiceConsumer := range []bool{true, false} {
			var rates [2][]float64 // without, with the stuck messages
			for round := range rounds {
				for k := range 2 {
					stuck := (k+round)%2 == 1
					r, err := stuckRun(ctx, conn, pub, o.AMQPURL, good, target, stuck, sluiceConsumer)
					if err != nil {
						return err
					}
					rates[btoi(stuck)] = append(rates[btoi(stuck)], r)
				}
			}
			kind := "watermill-amqp, 4 subscriptions"
			if sluiceConsumer {
				kind = "sluice Consumer, prefetch 16"
			}
			rows = append(rows, []string{target, kind, f0(Median(rates[0])), f0(Median(rates[1])), f2(MedianRatio(rates[1], rates[0]))})
		}
	}
	fmt.Fprintf(o.Out, "Good messages while %d cannot reach their target (the poison queue full; the first of two tiers deleted), %d good preloaded behind them, 1 ms of handler work, %d rounds interleaved\n\n", stuckCount, good, rounds)
	Table(o.Out, []string{"target", "subscriber", "good msg/s alone", fmt.Sprintf("good msg/s with %d stuck", stuckCount), "ratio"}, rows)
	fmt.Fprintln(o.Out, "target: ≥ 0.5 (a bad target does not starve the good messages)")
	return nil
}

// stuckRun preloads the stuck messages (if any) and good ones, consumes for
// as long as the good ones take (at most 20 s) and returns the good rate.
func stuckRun(ctx context.Context, conn *amqp.Connection, pub *rabbitmq.Publisher, url string, good int, target string, stuck, sluiceConsumer bool) (float64, error) {
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{
		Queue: fmt.Sprintf("sluice_bench_stuck_%d", time.Now().UnixNano()), TierDelays: []time.Duration{time.Minute, 2 * time.Minute},
	})
	if err != nil {
		return 0, err
	}
	if _, err := topo.Declare(ctx, conn); err != nil {
		return 0, err
	}
	defer deleteTopology(conn, topo)
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	if target == "poison queue full" {
		// Declared again as full: delete, then declare with a zero length limit.
		if _, err := ch.QueueDelete(topo.Config().PoisonQueue, false, false, false); err != nil {
			return 0, err
		}
		if _, err := ch.QueueDeclare(topo.Config().PoisonQueue, true, false, false, false,
			amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}); err != nil {
			return 0, err
		}
	} else if _, err := ch.QueueDelete(topo.Tiers()[0].Topic, false, false, false); err != nil {
		return 0, err
	}

	var batch []*message.Message
	if stuck {
		for i := range stuckCount {
			m := message.NewMessage(watermill.NewUUID(), make([]byte, 256))
			m.Metadata.Set(sluice.EventIDKey, "stuck-"+strconv.Itoa(i))
			m.Metadata.Set("stuck", "yes")
			batch = append(batch, m)
		}
	}
	for i := range good {
		m := message.NewMessage(watermill.NewUUID(), make([]byte, 256))
		m.Metadata.Set(sluice.EventIDKey, strconv.Itoa(i))
		batch = append(batch, m)
	}
	if err := pub.Publish(topo.Config().Queue, batch...); err != nil {
		return 0, err
	}

	var handled atomic.Int64
	done := make(chan struct{})
	stuckErr := sluice.Poison(errors.New("unknown version"))
	if target == "tier queue deleted" {
		stuckErr = sluice.Transient(errors.New("downstream timeout"))
	}
	handler := func(msg *message.Message) error {
		if msg.Metadata.Get("stuck") != "" {
			return stuckErr
		}
		time.Sleep(time.Millisecond)
		if handled.Add(1) == int64(good) {
			close(done)
		}
		return nil
	}
	// As router.Add configures it: a refused copy waits in the first tier.
	mws, err := router.Middlewares(router.Stages{ // poison → retrytiers → classify, as router.Add assembles them
		ShutdownGrace: -1, Poison: &poison.Config{Publisher: pub, Topic: topo.Config().PoisonQueue, ParkTopic: topo.Tiers()[0].Topic},
		Retry: &retrytiers.Config{Publisher: pub, Tiers: topo.Tiers()}, Classify: &stage.ClassifyConfig{},
	})
	if err != nil {
		return 0, err
	}
	subs := 1
	if !sluiceConsumer {
		subs = rabbitmqConsumers
	}
	sub, err := newSubscriber(url, sluiceConsumer, 0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Close() }()
	rt, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
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
	case <-time.After(20 * time.Second):
	}
	rate := float64(handled.Load()) / time.Since(start).Seconds()
	return rate, rt.Close()
}
