package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/rabbitmq"
)

// putBackChunk is how many messages the putback suite publishes at once.
const putBackChunk = 1000

// PutBack measures what a dlq.Queue.Each of a whole poison queue costs when the
// scan puts every message back, on three queues and the two ways Scan has:
// a plain classic queue (no arguments, as rabbitmq.Topology declares a
// classic poison queue) gets its messages back all at once by the close of
// the scan's channel; any other queue gets a basic.nack each, 8 at a time,
// the scan waiting after each 8 until the queue counts them back, which
// keeps a quorum queue's order past the 32 commands RabbitMQ's quorum-queue
// client holds unapplied — a classic queue with an argument (x-max-length,
// far above the queue's size), which keeps its order either way, and a
// quorum queue. Each queue holds o.Messages × 20 messages (10,000 at the
// default), the same for all; the suite prints the scan's time (its
// basic.gets, its put-back and its wait for the queue to count them
// again), whether a read afterwards finds them all in their order, and the
// ratios to the close's time. One round: the nack variants take tens of
// seconds at 10,000.
func PutBack(ctx context.Context, o Options) error {
	n := o.Messages * 20
	conn, pub, closeAll, err := dialBroker(o)
	if err != nil {
		return err
	}
	defer closeAll()
	version, _ := conn.Properties["version"].(string)
	fmt.Fprintf(o.Out, "putback: a dlq.Queue.Each of %d messages, every one put back (RabbitMQ %s)\n\n", n, version)
	variants := []struct {
		name string
		args amqp.Table
	}{
		{"plain classic (channel close)", nil},
		{"classic with x-max-length (a nack each)", amqp.Table{"x-max-length": int64(n * 10)}},
		{"quorum (a nack each, 8 at a time)", amqp.Table{"x-queue-type": amqp.QueueTypeQuorum}},
	}
	var rows [][]string
	took := make([]time.Duration, len(variants))
	for i, v := range variants {
		d, inOrder, err := putBackOnce(ctx, conn, pub, n, v.args)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		took[i] = d
		rows = append(rows, []string{v.name, fmt.Sprintf("%.2f s", d.Seconds()), fmt.Sprintf("%.0f", float64(n)/d.Seconds()), strconv.FormatBool(inOrder)})
	}
	Table(o.Out, []string{"queue", "scan", "messages/s", "all back in order"}, rows)
	fmt.Fprintf(o.Out, "\nnack each ÷ close: %.1f× the time; quorum ÷ close: %.1f×\n", took[1].Seconds()/took[0].Seconds(), took[2].Seconds()/took[0].Seconds())
	return nil
}

// putBackOnce fills a queue of its own with n messages (payload: their
// position), scans it with dlq.Queue.Each leaving every message, and reads it
// back (acking) to check the order; it deletes the queue.
func putBackOnce(ctx context.Context, conn *amqp.Connection, pub *rabbitmq.Publisher, n int, args amqp.Table) (time.Duration, bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = ch.Close() }()
	q := fmt.Sprintf("sluice_bench_putback_%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		return 0, false, err
	}
	defer func() {
		if c, err := conn.Channel(); err == nil {
			_, _ = c.QueueDelete(q, false, false, false)
			_ = c.Close()
		}
	}()
	for i := 0; i < n; i += putBackChunk {
		ms := make([]*message.Message, 0, putBackChunk)
		for j := i; j < min(i+putBackChunk, n); j++ {
			ms = append(ms, message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(j))))
		}
		if err := pub.Publish(q, ms...); err != nil {
			return 0, false, err
		}
	}
	t0 := time.Now()
	read, err := dlq.Open(conn, q, dlq.Config{}).Each(ctx, dlq.Filter{}, 0, func(*dlq.Message) error { return nil })
	took := time.Since(t0)
	if err != nil {
		return 0, false, err
	}
	if read != n {
		return 0, false, fmt.Errorf("the scan read %d of %d", read, n)
	}
	for i := range n {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			return 0, false, err
		}
		if !ok || string(d.Body) != strconv.Itoa(i) {
			return took, false, nil
		}
	}
	return took, true, nil
}
