package dlq

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Inspect returns at most limit selected messages (0: all), returning every
// message to the queue.
func Inspect(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int) ([]*Message, error) {
	var out []*Message
	_, err := Each(ctx, conn, queue, f, limit, func(m *Message) error {
		out = append(out, m)
		return nil
	})
	return out, err
}

// Each calls fn with each selected message, at most limit (0: all), as it
// reads them: a caller that keeps nothing holds one message in memory at a
// time, whatever the queue's size. It returns how many it selected; every
// message stays in the queue.
func Each(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int, fn func(*Message) error) (int, error) {
	n := 0
	_, err := Scan(ctx, conn, queue, func(m *Message) (bool, error) {
		if !f.Match(m) {
			return false, nil
		}
		n++
		if err := fn(m); err != nil {
			return true, err
		}
		return limit > 0 && n >= limit, nil
	}, nil)
	return n, err
}
