package rabbitmq

import (
	"cmp"
	"fmt"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/internal/diag"
)

// prefetchDefault is the default prefetch of BrokerConfig and
// ConsumerConfig: with Sluice's Consumer, how many deliveries one
// subscription hands to the router's handlers at once — the connections a
// database pool the handlers share needs, beside its other users.
const prefetchDefault = 16

// checkWatermillSubscriber refuses what watermill-amqp's subscriber cannot
// do with conn (validated) and prefetch, the BrokerConfig's.
func checkWatermillSubscriber(conn Connection, prefetch int) error {
	if len(conn.URLs) > 1 {
		return fmt.Errorf("rabbitmq: BrokerConfig.URLs has %d nodes: watermill-amqp's subscriber (WatermillSubscriber) connects to one; "+
			"Sluice's Consumer, NewBroker's default, moves between several", len(conn.URLs))
	}
	if prefetch < 0 {
		return fmt.Errorf("rabbitmq: BrokerConfig.Prefetch must be positive, got %d", prefetch)
	}
	return nil
}

// newSubscriber is BrokerConfig.WatermillSubscriber's subscriber:
// watermill-amqp's, consuming the queue named by the topic given to
// Subscribe, unmarshalling with Marshaler (so deliveries carrying x-death
// or other non-string headers are handled, not nacked in a loop),
// requeueing on nack, reading through the frame filter, and declaring
// nothing (NewBroker did): Subscribe on a queue that does not exist fails,
// matching ErrQueueNotFound and naming the queue. It reconnects after a
// broker restart. One subscription handles one delivery at a time (hence
// the Broker's 4 consumers). It dials with watermill-amqp's timeouts (not
// DialTimeout nor WriteTimeout) and records no metrics. conn and prefetch
// are a BrokerConfig's, validated (BrokerConfig.withDefaults). A
// watermill-amqp Config of your own reads with the Marshaler through
// WithMarshaler.
func newSubscriber(conn Connection, prefetch int) (message.Subscriber, error) {
	url := conn.URLs[0]
	c := wamqp.NewDurableQueueConfig(url)
	c.Connection.TLSConfig = conn.TLS
	c.Marshaler = Marshaler{}
	c.Consume.Qos.PrefetchCount = cmp.Or(prefetch, prefetchDefault)
	c.TopologyBuilder = declaredElsewhere{}
	c, err := filtered(c)
	if err != nil {
		return nil, err
	}
	sub, err := wamqp.NewSubscriber(c, conn.Logger)
	if err != nil { // a nil *wamqp.Subscriber is not returned as a non-nil message.Subscriber
		return nil, fmt.Errorf("rabbitmq: connecting the subscriber to %s: %w", diag.RedactURL(url), diag.RedactError(err))
	}
	return sub, nil
}
