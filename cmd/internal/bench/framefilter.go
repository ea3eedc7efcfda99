package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/amqpframe"
)

// FrameFilter measures what Sluice's frame filter (internal/amqpframe,
// which every connection Sluice opens reads through) costs amqp091-go:
// the consume rate (a queue preloaded with o.Messages*20 messages carrying
// the headers a Sluice publisher writes, consumed with prefetch 100 and
// each delivery acked) and the confirmed publish rate (o.Messages*20
// messages, 100 unconfirmed at most), each on a connection with the filter
// and one without, interleaved round after round; the ratio is filtered
// over unfiltered.
func FrameFilter(ctx context.Context, o Options) error {
	n := o.Messages * 20
	conns := [2]*amqp.Connection{}
	for i, filtered := range []bool{false, true} {
		url, cfg := o.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second), Properties: amqp.Table{"connection_name": "sluice bench framefilter"}}
		if filtered {
			var err error
			if url, cfg, err = amqpframe.Config(url, cfg); err != nil {
				return err
			}
		}
		c, err := amqp.DialConfig(url, cfg)
		if err != nil {
			return fmt.Errorf("connecting to RabbitMQ: %w", err)
		}
		defer func() { _ = c.Close() }()
		conns[i] = c
	}
	queue := fmt.Sprintf("sluice_bench_framefilter_%d", time.Now().UnixNano())
	ch, err := conns[0].Channel()
	if err != nil {
		return err
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false); _ = ch.Close() }()
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		return err
	}
	var consume, publish [2][]float64
	for round := range o.Rounds {
		for k := range 2 {
			v := (k + round) % 2 // alternate which goes first
			r, err := confirmedPublishRate(ctx, conns[v], queue, n)
			if err != nil {
				return err
			}
			publish[v] = append(publish[v], r)
			if r, err = consumeRate(ctx, conns[v], queue, n); err != nil {
				return err
			}
			consume[v] = append(consume[v], r)
		}
	}
	fmt.Fprintf(o.Out, "amqp091-go with and without Sluice's frame filter, %d messages (1 KiB body, 6 headers) per run, %d rounds interleaved\n\n", n, o.Rounds)
	Table(o.Out, []string{"", "unfiltered msg/s", "filtered msg/s", "ratio"}, [][]string{
		{"consume (prefetch 100, ack each)", f0(Median(consume[0])), f0(Median(consume[1])), f2(MedianRatio(consume[1], consume[0]))},
		{"confirmed publish (100 in flight)", f0(Median(publish[0])), f0(Median(publish[1])), f2(MedianRatio(publish[1], publish[0]))},
	})
	fmt.Fprintln(o.Out, "target: ratio ≥ 0.97")
	return nil
}

// benchHeaders are the headers of a message Sluice's publisher writes.
var benchHeaders = amqp.Table{
	"_watermill_message_uuid": "0b9f3a4e-6c1d-4b1e-9a57-3f0e2c9d8b71", "sluice_event_id": "evt-0123456789",
	"sluice_event_type": "order.created", "sluice_attempt": "1", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	"x-schema-version": int32(3),
}

// confirmedPublishRate publishes n persistent messages to queue on conn,
// at most 100 unconfirmed, and returns messages per second.
func confirmedPublishRate(ctx context.Context, conn *amqp.Connection, queue string, n int) (float64, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	body := make([]byte, 1024)
	window := make(chan *amqp.DeferredConfirmation, 100)
	start := time.Now()
	wait := func(dc *amqp.DeferredConfirmation) error {
		ok, err := dc.WaitContext(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("publish %d nacked", dc.DeliveryTag)
		}
		return err
	}
	for i := range n {
		if len(window) == cap(window) {
			if err := wait(<-window); err != nil {
				return 0, err
			}
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			Headers: benchHeaders, MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body})
		if err != nil {
			return 0, err
		}
		window <- dc
	}
	for len(window) > 0 {
		if err := wait(<-window); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// consumeRate consumes n messages from queue on conn, prefetch 100, acking
// each, and returns messages per second.
func consumeRate(ctx context.Context, conn *amqp.Connection, queue string, n int) (float64, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Qos(100, 0, false); err != nil {
		return 0, err
	}
	start := time.Now()
	ds, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	for range n {
		select {
		case d, ok := <-ds:
			if !ok {
				return 0, fmt.Errorf("consumer of %s closed", queue)
			}
			if len(d.Headers) != len(benchHeaders) {
				return 0, fmt.Errorf("delivery %s read with %d headers, want %d", d.MessageId, len(d.Headers), len(benchHeaders))
			}
			if err := d.Ack(false); err != nil {
				return 0, err
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Minute):
			return 0, fmt.Errorf("no delivery from %s in a minute", queue)
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
