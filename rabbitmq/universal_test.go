package rabbitmq_test

import (
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// declaringConsumer is Sluice's Consumer with the queue of each topic
// declared before it is used (SubscribeInitialize, as the universal suite
// asks of a Pub/Sub whose topics must exist first): Sluice's topology
// declares queues, the Consumer only consumes them.
type declaringConsumer struct {
	*rabbitmq.Consumer
	t        *testing.T
	mu       sync.Mutex
	declared map[string]bool
}

func (c *declaringConsumer) SubscribeInitialize(topic string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.declared[topic] {
		return nil
	}
	ch := testenv.Channel(c.t, testenv.AMQP(c.t))
	if _, err := ch.QueueDeclare(topic, true, false, false, false, nil); err != nil {
		return err
	}
	testenv.DeleteQueuesAtEnd(c.t, topic)
	c.declared[topic] = true
	return nil
}

var _ message.SubscribeInitializer = (*declaringConsumer)(nil)

// universalPubSub builds Sluice's confirmed Publisher and its Consumer with
// its defaults: DrainTimeoutDefault fits the suite's 15 s waits (the 30 s
// drain before did not: TestMessageCtx's unacked message kept its context
// for 30 s after Close).
func universalPubSub(t *testing.T) (message.Publisher, message.Subscriber) {
	return universalPubSubDraining(t, 0)
}

// stressDrainTimeout is the stress variant's DrainTimeout. Each of its ten
// TestMessageCtx copies closes the Consumer with a delivery unacked and
// waits for the drain to end: at the default, 12 s each, 120 s of the
// package's -parallel slots spent waiting (the slowest part of the
// rabbitmq package in make test). Whether the default fits the suite's
// waits is TestUniversalPubSub's to check.
const stressDrainTimeout = 2 * time.Second

// universalPubSubDraining is universalPubSub with the Consumer's
// DrainTimeout (its default if zero).
func universalPubSubDraining(t *testing.T, drain time.Duration) (message.Publisher, message.Subscriber) {
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, ConfirmTimeout: 10 * time.Second})
	require.NoError(t, err)
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, DrainTimeout: drain})
	require.NoError(t, err)
	return pub, &declaringConsumer{Consumer: c, t: t, declared: map[string]bool{}}
}

// TestUniversalPubSub runs Watermill's universal Pub/Sub suite — the tests
// every Watermill Pub/Sub passes — on Sluice's Publisher and Consumer.
// TestMessageCtx closes the subscriber with a delivery never acked: once the
// drain timeout ends, that delivery's context is cancelled (before, it lived
// on, its handler still inside its inbox transaction while the broker
// redelivered it elsewhere).
func TestUniversalPubSub(t *testing.T) {
	t.Parallel()
	features := tests.Features{
		ConsumerGroups:      false, // a queue is the group: competing consumers share it
		ExactlyOnceDelivery: false,
		GuaranteedOrder:     false, // 16 deliveries in flight, acked in any order
		Persistent:          true,
		// A topic is a queue on the default exchange; the suite's names fit AMQP's limit.
	}
	tests.TestPubSub(t, features, universalPubSub, nil)
}

// TestUniversalPubSubStress runs the suite's stress variant: each test ten
// times at once, at the suite's short counts (ForceShort; TestPublisherClose
// publishes 100 messages, not 10,000). The full counts run once, in
// TestUniversalPubSub: ten copies of them at once took 332 s of make test's
// rabbitmq package, alone for its last 250 s, and the concurrency the
// variant is for is the same at either count. Its Consumers drain for
// stressDrainTimeout, not the default: the default's fit is checked once,
// in TestUniversalPubSub.
func TestUniversalPubSubStress(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the stress variant runs without -short")
	}
	tests.TestPubSubStressTest(t, tests.Features{Persistent: true, ForceShort: true}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return universalPubSubDraining(t, stressDrainTimeout)
	}, nil)
}
