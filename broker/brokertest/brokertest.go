// Package brokertest is the conformance suite of a broker.Broker: what
// router.Add and the stages rely on of a broker's endpoints. The embedded
// default and the rabbitmq broker run it, and so should a broker written
// elsewhere:
//
//	func TestMyBroker(t *testing.T) {
//		brokertest.Run(t, func(t *testing.T) brokertest.Broker {
//			b := newBrokerOfAQueueOfItsOwn(t, 100*time.Millisecond) // a short first tier
//			return brokertest.Broker{Broker: b, Input: b.Publisher()}
//		})
//	}
package brokertest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/metakeys"
)

// Broker is a broker under test, of one queue of its own, with a ladder
// whose first tier waits at most 5 s; Input publishes into its
// queue (Endpoints().Topic), as a producer would.
type Broker struct {
	broker.Broker
	Input message.Publisher
}

// tierWaitMax is the longest first tier the suite waits for.
const tierWaitMax = 5 * time.Second

// waitMax bounds every other wait of the suite.
const waitMax = 30 * time.Second

// NewBroker returns a broker of t's own, closed by t.Cleanup.
type NewBroker func(t *testing.T) Broker

// Run runs the suite against the brokers newBroker returns, each subtest
// with its own, in parallel.
func Run(t *testing.T, newBroker NewBroker) {
	t.Helper()
	for name, fn := range map[string]func(*testing.T, Broker){
		"Endpoints":                   testEndpoints,
		"DeliversWhatIsPublished":     testDelivers,
		"ANackRedelivers":             testNackRedelivers,
		"ACopyComesBackFromItsTier":   testTierCopyComesBack,
		"ThePoisonQueueTakesACopy":    testPoison,
		"AnEngagedGateStopsConsuming": testGate,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newBroker(t))
		})
	}
}

// testEndpoints: a topic and a subscriber; tiers in order of their delay,
// each with a topic of its own within broker.NameMaxLength; the publishers
// of the copies; a poison queue that is not the topic.
func testEndpoints(t *testing.T, b Broker) {
	e := b.Endpoints()
	require.NotEmpty(t, e.Topic)
	require.NotNil(t, e.Subscriber)
	require.NotEmpty(t, e.System, "messaging.system of the spans and metrics")
	require.NotEmpty(t, e.Tiers, "a retry ladder")
	require.NotNil(t, e.RetryPublisher)
	require.NotNil(t, e.PoisonPublisher)
	require.NotEmpty(t, e.PoisonTopic)
	require.NotEqual(t, e.Topic, e.PoisonTopic)
	seen := map[string]bool{e.Topic: true, e.PoisonTopic: true}
	for i, tier := range e.Tiers {
		require.NotEmpty(t, tier.Name)
		require.GreaterOrEqual(t, tier.Delay, time.Millisecond)
		if i > 0 {
			require.Greater(t, tier.Delay, e.Tiers[i-1].Delay, "tiers in order of their delay")
		}
		for _, topic := range tier.Topics() {
			require.NoError(t, broker.CheckName("tier topic", topic))
			require.False(t, seen[topic], "topic %q used twice", topic)
			seen[topic] = true
		}
	}
	require.GreaterOrEqual(t, e.Consumers, 0)
	require.True(t, e.MaxConsumers == 0 || e.MaxConsumers >= max(e.Consumers, 1))
}

// subscribe subscribes to the broker's topic until t ends.
func subscribe(t *testing.T, sub message.Subscriber, topic string) <-chan *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		for range ch { // drained by the subscriber's close
		}
	})
	return ch
}

func receive(t *testing.T, ch <-chan *message.Message, within time.Duration) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "the subscription closed")
		return m
	case <-time.After(within):
		require.FailNow(t, "nothing delivered", "within %s", within)
		return nil
	}
}

func newMessage(id string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(`{"id":"`+id+`"}`))
	m.Metadata.Set(sluice.EventIDKey, id)
	m.Metadata.Set("producer_header", "kept as is")
	return m
}

// testDelivers: a published message is delivered with its payload and
// metadata; acked, it is not delivered again.
func testDelivers(t *testing.T, b Broker) {
	e := b.Endpoints()
	ch := subscribe(t, e.Subscriber, e.Topic)
	require.NoError(t, b.Input.Publish(e.Topic, newMessage("evt-1")))
	m := receive(t, ch, waitMax)
	require.Equal(t, `{"id":"evt-1"}`, string(m.Payload))
	require.Equal(t, "evt-1", m.Metadata.Get(sluice.EventIDKey))
	require.Equal(t, "kept as is", m.Metadata.Get("producer_header"))
	m.Ack()
	require.NoError(t, b.Input.Publish(e.Topic, newMessage("evt-2")))
	m = receive(t, ch, waitMax)
	require.Equal(t, "evt-2", m.Metadata.Get(sluice.EventIDKey), "evt-1 was not delivered again")
	m.Ack()
}

// testNackRedelivers: a nacked delivery comes back.
func testNackRedelivers(t *testing.T, b Broker) {
	e := b.Endpoints()
	ch := subscribe(t, e.Subscriber, e.Topic)
	require.NoError(t, b.Input.Publish(e.Topic, newMessage("evt-1")))
	receive(t, ch, waitMax).Nack()
	m := receive(t, ch, waitMax)
	require.Equal(t, "evt-1", m.Metadata.Get(sluice.EventIDKey), "the nacked delivery came back")
	m.Ack()
}

// testTierCopyComesBack: a copy published to the first tier comes back to
// the topic after the tier's delay, not before, marked as back from that
// tier (sluice_amqp_last_death_queue, reason expired: the keyless proof that
// Sluice wrote its retry history).
func testTierCopyComesBack(t *testing.T, b Broker) {
	e := b.Endpoints()
	tier := e.Tiers[0]
	require.LessOrEqual(t, tier.Delay, tierWaitMax, "the suite needs a first tier of at most %s", tierWaitMax)
	ch := subscribe(t, e.Subscriber, e.Topic)
	c := newMessage("evt-1")
	c.Metadata.Set(sluice.AttemptKey, "2")
	start := time.Now()
	require.NoError(t, e.RetryPublisher.Publish(tier.Topic, c))
	m := receive(t, ch, tier.Delay+waitMax)
	require.GreaterOrEqual(t, time.Since(start), tier.Delay, "not before the tier's delay")
	require.Equal(t, "evt-1", m.Metadata.Get(sluice.EventIDKey))
	require.Equal(t, "2", m.Metadata.Get(sluice.AttemptKey), "the copy's metadata kept")
	require.Contains(t, tier.Topics(), m.Metadata.Get(metakeys.DeadLetterQueue), "back from the tier")
	require.Equal(t, metakeys.DeadLetterExpired, m.Metadata.Get(metakeys.DeadLetterReason))
	m.Ack()
}

// testPoison: the poison publisher takes a copy and returns once it is
// stored; nothing of it comes back to the topic.
func testPoison(t *testing.T, b Broker) {
	e := b.Endpoints()
	ch := subscribe(t, e.Subscriber, e.Topic)
	require.NoError(t, e.PoisonPublisher.Publish(e.PoisonTopic, newMessage("evt-poison")))
	require.NoError(t, b.Input.Publish(e.Topic, newMessage("evt-1")))
	m := receive(t, ch, waitMax)
	require.Equal(t, "evt-1", m.Metadata.Get(sluice.EventIDKey), "the poison copy is not delivered to the topic")
	m.Ack()
}

// gate is a broker.Gate the test moves.
type gate struct {
	mu      sync.Mutex
	engaged bool
	changed chan struct{}
}

func (g *gate) Engaged() (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.engaged, g.changed
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.engaged = false
	close(g.changed)
	g.changed = make(chan struct{})
}

// testGate: a subscriber that is a broker.GatedSubscriber hands out nothing
// while its gate is engaged and resumes when it is released. A broker whose
// subscriber is not one passes (the brake then holds deliveries in the
// stage).
func testGate(t *testing.T, b Broker) {
	e := b.Endpoints()
	gs, ok := e.Subscriber.(broker.GatedSubscriber)
	if !ok {
		t.Skip("the subscriber cannot stop consuming (not a broker.GatedSubscriber)")
	}
	g := &gate{engaged: true, changed: make(chan struct{})}
	ch := subscribe(t, gs.WithGate(g), e.Topic)
	require.NoError(t, b.Input.Publish(e.Topic, newMessage("evt-1")))
	select {
	case m := <-ch:
		require.Failf(t, "delivered while the gate was engaged", "%s", m.Metadata.Get(sluice.EventIDKey))
	case <-time.After(500 * time.Millisecond): // a bounded look for a delivery that must not come
	}
	g.release()
	m := receive(t, ch, waitMax)
	require.Equal(t, "evt-1", m.Metadata.Get(sluice.EventIDKey))
	m.Ack()
}
