package dlq

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// discard is Queue.Discard on conn's queue.
func discard(ctx context.Context, conn *amqp.Connection, queue string, f Filter, limit int, dryRun bool) (Result, []string, error) {
	res := Result{ByTarget: map[string]int{}}
	var discarded []string
	err := scanSelected(ctx, conn, queue, f, limit, &res, func(m *Message) error {
		if !dryRun {
			if err := m.ack(); err != nil {
				return err
			}
			res.Replayed++
		}
		discarded = append(discarded, m.Item())
		return nil
	}, nil)
	return res, discarded, err
}
