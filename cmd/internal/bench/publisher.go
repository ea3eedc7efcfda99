package bench

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/rabbitmq"
)

// Publisher compares confirmed, mandatory, persistent publishing of 1 KiB
// messages to a durable queue:
//
//	batch: one Publish of o.PublishBatch messages — Sluice's publisher vs
//	  watermill-amqp with ConfirmDelivery (default config: a channel per
//	  Publish, one confirm awaited at a time) vs raw amqp091-go with
//	  pipelined deferred confirms;
//	concurrent: 8 goroutines publishing one message at a time and waiting
//	  for its confirm — Sluice's publisher vs watermill-amqp with
//	  ConfirmDelivery and a channel pool of 8.
//
// The batch comparison runs twice: on loopback, and through a proxy that
// adds a 1 ms round trip, as a broker on another host would.
func Publisher(ctx context.Context, o Options) error {
	fmt.Fprintf(o.Out, "Confirmed publishing to RabbitMQ: persistent, mandatory, 1 KiB; %d rounds, interleaved\n", max(o.Rounds/4, 3))
	if err := publisherSuite(ctx, o, o.AMQPURL, "loopback", true); err != nil {
		return err
	}
	// The same batch comparison across a 1 ms network round trip: a proxy on
	// loopback holds every chunk 0.5 ms each way.
	u, err := url.Parse(o.AMQPURL)
	if err != nil {
		return err
	}
	proxy, err := newLatencyProxy(u.Host, 500*time.Microsecond)
	if err != nil {
		return err
	}
	defer func() { _ = proxy.Close() }()
	u.Host = proxy.Addr()
	return publisherSuite(ctx, o, u.String(), "1 ms round trip (latency proxy)", false)
}

func publisherSuite(ctx context.Context, o Options, amqpURL, label string, concurrent bool) error {
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: amqpURL}, "sluice bench")
	if err != nil {
		return fmt.Errorf("connecting to RabbitMQ: %w", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	q := fmt.Sprintf("sluice_bench_pub_%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		return err
	}
	defer func() { _, _ = ch.QueueDelete(q, false, false, false) }()
	purge := func(context.Context) error { _, err := ch.QueuePurge(q, false); return err }

	sluicePub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: amqpURL}})
	if err != nil {
		return err
	}
	defer func() { _ = sluicePub.Close() }()
	wmCfg := wamqp.NewDurableQueueConfig(amqpURL)
	wmCfg.Publish.ConfirmDelivery, wmCfg.Publish.Mandatory = true, true
	wmPub, err := wamqp.NewPublisher(wmCfg, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer func() { _ = wmPub.Close() }()
	wmCfg.Publish.ChannelPoolSize = 8
	wmPool, err := wamqp.NewPublisher(wmCfg, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer func() { _ = wmPool.Close() }()
	raw, err := newRawPublisher(conn)
	if err != nil {
		return err
	}
	defer func() { _ = raw.ch.Close() }()

	payload := make([]byte, 1024)
	batch := func(n int) []*message.Message {
		ms := make([]*message.Message, n)
		for i := range ms {
			ms[i] = message.NewMessage(watermill.NewUUID(), payload)
			ms[i].Metadata.Set("sluice_event_id", strconv.Itoa(i))
		}
		return ms
	}

	// Batch: one run is one Publish of the whole batch; rates in messages/s.
	n := o.PublishBatch
	wmN := max(n/10, 1) // watermill-amqp is slow enough that a tenth gives a stable rate
	batchOps := []struct {
		name string
		n    int
		pub  func([]*message.Message) error
	}{
		{"sluice publisher", n, func(ms []*message.Message) error { return sluicePub.Publish(q, ms...) }},
		{"watermill-amqp ConfirmDelivery", wmN, func(ms []*message.Message) error { return wmPub.Publish(q, ms...) }},
		{"raw amqp091 pipelined", n, func(ms []*message.Message) error { return raw.publish(q, ms) }},
	}
	rounds := max(o.Rounds/4, 3)
	rates := make([][]float64, len(batchOps))
	for round := range rounds {
		for k := range batchOps {
			i := (k + round) % len(batchOps)
			if err := purge(ctx); err != nil {
				return err
			}
			ms := batch(batchOps[i].n)
			start := time.Now()
			if err := batchOps[i].pub(ms); err != nil {
				return fmt.Errorf("%s: %w", batchOps[i].name, err)
			}
			rates[i] = append(rates[i], float64(len(ms))/time.Since(start).Seconds())
		}
	}
	fmt.Fprintf(o.Out, "\n%s — batch of %d (watermill-amqp: %d) in one Publish:\n", label, n, wmN)
	Table(o.Out, []string{"publisher", "msg/s", "sluice ÷ it"}, [][]string{
		{batchOps[0].name, f0(Median(rates[0])), ""},
		{batchOps[1].name, f0(Median(rates[1])), f2(MedianRatio(rates[0], rates[1]))},
		{batchOps[2].name, f0(Median(rates[2])), f2(MedianRatio(rates[0], rates[2]))},
	})
	fmt.Fprintln(o.Out, "targets: sluice ÷ watermill-amqp ≥ 10; sluice ÷ raw ≥ 0.8")
	if !concurrent {
		return nil
	}

	// Concurrent: 8 goroutines, one message per Publish.
	one := func(pub message.Publisher) Op {
		return func(context.Context, int) error {
			return pub.Publish(q, message.NewMessage(watermill.NewUUID(), payload))
		}
	}
	conc, err := Interleave(ctx, Options{Rounds: rounds, Messages: o.Messages * 4}, 8, 2, func(_, v int) Op {
		return []Op{one(sluicePub), one(wmPool)}[v]
	}, purge)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "\n%s — 8 goroutines, one message per Publish, each waiting for its confirm (%d messages per run):\n", label, o.Messages*4)
	Table(o.Out, []string{"publisher", "msg/s", "sluice ÷ it"}, [][]string{
		{"sluice publisher (one shared channel)", f0(Median(conc[0])), ""},
		{"watermill-amqp ConfirmDelivery, pool of 8", f0(Median(conc[1])), f2(MedianRatio(conc[0], conc[1]))},
	})
	fmt.Fprintln(o.Out, "target: sluice ÷ watermill-amqp ≥ 2")
	return nil
}

// rawPublisher is what a careful engineer writes with amqp091-go alone:
// confirm mode, every message published with a deferred confirmation, then
// all awaited. It does not match basic.returns to messages.
type rawPublisher struct{ ch *amqp.Channel }

func newRawPublisher(conn *amqp.Connection) (*rawPublisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	return &rawPublisher{ch: ch}, ch.Confirm(false)
}

func (r *rawPublisher) publish(q string, ms []*message.Message) error {
	dcs := make([]*amqp.DeferredConfirmation, len(ms))
	for i, m := range ms {
		dc, err := r.ch.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{
			Headers: amqp.Table{"sluice_event_id": m.Metadata.Get("sluice_event_id"), "_watermill_message_uuid": m.UUID},
			Body:    m.Payload, DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			return err
		}
		dcs[i] = dc
	}
	for _, dc := range dcs {
		if !dc.Wait() {
			return fmt.Errorf("nacked")
		}
	}
	return nil
}
