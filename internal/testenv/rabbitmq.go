package testenv

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// AMQP opens a connection to the test broker, closed when t ends. A test
// fails, not skips, when RabbitMQ is not reachable: `make services` provides it.
func AMQP(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(AMQPURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	require.NoError(t, err, "RabbitMQ at %s (run `make services`)", redact(AMQPURL))
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Channel opens a channel on conn, closed when t ends.
func Channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// DeleteQueuesAtEnd deletes the named queues (and exchanges, for names given
// with the "exchange:" prefix) when t ends, on a connection of its own.
func DeleteQueuesAtEnd(t testing.TB, names ...string) {
	t.Helper()
	t.Cleanup(func() {
		conn, err := amqp.Dial(AMQPURL)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer func() { _ = conn.Close() }()
		for _, n := range names {
			ch, err := conn.Channel()
			if err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			if len(n) > 9 && n[:9] == "exchange:" {
				_ = ch.ExchangeDelete(n[9:], false, false)
			} else {
				_, _ = ch.QueueDelete(n, false, false, false)
			}
			_ = ch.Close()
		}
	})
}

// QueueDepth returns the number of ready messages in queue.
func QueueDepth(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err, "queue %s", queue)
	return q.Messages
}

// Drain takes every ready message from queue (acking them) and returns them.
func Drain(t testing.TB, conn *amqp.Connection, queue string) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}
