package rabbitmq_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/stage"
)

// addReliableHandler wires the RabbitMQ stages around a handler: the queue,
// its 30s → 5m → 30m tiers and its poison queue; the confirmed publisher for
// the copies; poison → retrytiers → classify around the handler.
func addReliableHandler(ctx context.Context, router *message.Router, url string, handler message.NoPublishHandlerFunc) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	topo, err := rabbitmq.NewTopology(rabbitmq.TopologyConfig{Queue: "inventory", Quorum: true, DeliveryLimit: 20})
	if err != nil {
		return err
	}
	if _, err := topo.Declare(ctx, conn); err != nil {
		return err // a *rabbitmq.ConflictError names the argument that differs
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: url}}) // confirms + mandatory
	if err != nil {
		return err
	}
	// Sluice's Consumer: the deliveries of its prefetch in flight, a draining close.
	sub, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: url}})
	if err != nil {
		return err
	}
	isolate, err := poison.New(poison.Config{Publisher: pub, Topic: topo.Config().PoisonQueue, Queue: topo.Config().Queue})
	if err != nil {
		return err
	}
	retry, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: topo.Tiers()})
	if err != nil {
		return err
	}
	classify, err := stage.Classify(stage.ClassifyConfig{})
	if err != nil {
		return err
	}
	router.AddConsumerHandler("inventory", topo.Config().Queue, sub, handler).AddMiddleware(isolate, retry, classify)
	return nil
}

// Wiring the stages on RabbitMQ (compiled, not run: it needs a broker).
func Example_stack() {
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	err = addReliableHandler(context.Background(), router, "amqp://guest:guest@127.0.0.1:5672/",
		func(msg *message.Message) error { return nil })
	if err != nil {
		panic(err)
	}
}
