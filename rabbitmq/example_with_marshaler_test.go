package rabbitmq_test

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/rabbitmq"
)

// A service's own watermill-amqp subscriber, its config kept — the queue it
// declares, its settings — reading with Sluice's Marshaler, so a producer's
// integer header or a tier's x-death is not a nack loop. Behaviour tested
// on the broker in TestWithMarshalerKeepsTheServicesConfigAndReadsIntegerHeaders.
func ExampleWithMarshaler() {
	var sub message.Subscriber
	connect := func(amqpURL string, logger watermill.LoggerAdapter) error {
		cfg, err := rabbitmq.WithMarshaler(amqp.NewDurableQueueConfig(amqpURL)) // your config, as it was
		if err != nil {
			return err // a marshaler it cannot carry over, or Consume.NoRequeueOnNack: named
		}
		sub, err = amqp.NewSubscriber(cfg, logger) // watermill-amqp's, declaring what it declared before
		return err
	}
	_, _ = connect, sub
}
