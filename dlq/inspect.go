package dlq

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// inspect is Queue.Inspect on conn's queue.
func inspect(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int) ([]*Message, error) {
	var out []*Message
	_, err := each(ctx, conn, queue, f, limit, func(m *Message) error {
		out = append(out, m)
		return nil
	})
	return out, err
}

// each is Queue.Each on conn's queue.
func each(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int, fn func(*Message) error) (int, error) {
	n := 0
	_, err := scanQueue(ctx, conn, queue, func(m *Message) (bool, error) {
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
