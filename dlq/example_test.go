package dlq_test

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Open a poison queue, look at what failed, and replay one kind of failure
// back to the queues the messages came from, each copy confirmed before its
// original leaves the poison queue.
func ExampleOpen() {
	ctx := context.Background()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: "amqp://guest:guest@127.0.0.1:5672/"}})
	if err != nil {
		return
	}
	defer func() { _ = pub.Close() }()

	q := dlq.Open(conn, "orders.poison", dlq.Config{Publisher: pub, Operator: "alice"})
	stats, err := q.Stats(ctx, dlq.Filter{}, 0)
	if err != nil {
		return
	}
	fmt.Println(stats.Total, "poisoned, by class:", stats.ByClass)
	res, err := q.Replay(ctx, dlq.ReplayConfig{Filter: dlq.Filter{Classes: []string{"exhausted"}}})
	fmt.Println(res.Replayed, "replayed", err)
}
