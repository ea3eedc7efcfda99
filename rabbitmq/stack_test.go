package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/stage"
)

var shortTiers = []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, time.Second}

// stack is a Watermill router consuming one queue through
// poison → retrytiers → classify → handler, on the real broker.
type stack struct {
	topo *rabbitmq.Topology
	conn *amqp.Connection
	pub  *rabbitmq.Publisher

	mu    sync.Mutex
	calls map[string][]*message.Message // by event id: every delivery seen

	log *testenv.Log // the subscriber's

	// stop closes the router, once every handler in flight returned
	// (newBrokerStack's).
	stop func()
}

func newStack(t *testing.T, cfg rabbitmq.TopologyConfig, handler func(s *stack, msg *message.Message) error) *stack {
	t.Helper()
	return newStackBehind(t, cfg, nil, handler)
}

// newStackBehind is newStack on a router that has the router-level
// middlewares outer (Watermill's Timeout, Retry, ...) added before the
// handler, as an existing router has them: they run outside the stages.
func newStackBehind(t *testing.T, cfg rabbitmq.TopologyConfig, outer []message.HandlerMiddleware, handler func(s *stack, msg *message.Message) error) *stack {
	t.Helper()
	if cfg.TierDelays == nil {
		cfg.TierDelays = shortTiers
	}
	s := &stack{topo: newTopology(t, cfg), conn: testenv.AMQP(t), pub: newPublisher(t, ""), calls: map[string][]*message.Message{}, log: testenv.NewLog()}

	p, err := poison.New(poison.Config{Publisher: s.pub, Topic: s.topo.Config().PoisonQueue, Queue: s.topo.Config().Queue, Env: sluice.Env{PublishBackoff: 100 * time.Millisecond}})
	require.NoError(t, err)
	r, err := retrytiers.New(retrytiers.Config{Publisher: s.pub, Tiers: s.topo.Tiers(), Env: sluice.Env{PublishBackoff: 100 * time.Millisecond}})
	require.NoError(t, err)
	c, err := stage.Classify(stage.ClassifyConfig{})
	require.NoError(t, err)

	sub, err := rabbitmq.NewWatermillSubscriber(rabbitmq.Connection{URL: testenv.AMQPURL, Logger: s.log})
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(outer...)
	router.AddConsumerHandler("inventory", s.topo.Config().Queue, sub, func(msg *message.Message) error {
		s.mu.Lock()
		id := msg.Metadata.Get(sluice.EventIDKey)
		s.calls[id] = append(s.calls[id], msg.Copy())
		s.mu.Unlock()
		return handler(s, msg)
	}).AddMiddleware(p, r, c)

	done := testenv.RunRouter(context.Background(), router)
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
		require.NoError(t, sub.Close())
	})
	return s
}

func (s *stack) deliveries(id string) []*message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*message.Message(nil), s.calls[id]...)
}

func (s *stack) publish(t *testing.T, id string, md ...string) {
	t.Helper()
	m := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"o-1"}`))
	m.Metadata.Set(sluice.EventIDKey, id)
	for i := 0; i+1 < len(md); i += 2 {
		m.Metadata.Set(md[i], md[i+1])
	}
	require.NoError(t, s.pub.Publish(s.topo.Config().Queue, m))
}

// handled waits until the handler has seen event id n times.
func (s *stack) handled(t *testing.T, id string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(s.deliveries(id)) >= n }, time.Minute, 10*time.Millisecond,
		"event %s handled %d times", id, n)
}

// settled waits until the poison queue holds wantPoison messages and the
// main and tier queues are empty, and returns the poison queue's messages.
// Call it once the handler has seen what it expects (handled): a delivery in
// flight is in no queue's ready count.
func (s *stack) settled(t *testing.T, wantPoison int) []amqp.Delivery {
	t.Helper()
	require.Eventually(t, func() bool {
		return testenv.QueueDepth(t, s.conn, s.topo.Config().PoisonQueue) >= wantPoison
	}, time.Minute, 20*time.Millisecond, "poison queue")
	queues := []string{s.topo.Config().Queue}
	for _, tier := range s.topo.Tiers() {
		queues = append(queues, tier.Topic)
	}
	ch := testenv.Channel(t, s.conn)
	require.Eventually(t, func() bool {
		for _, q := range queues {
			info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil || info.Messages != 0 {
				return false
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond, "main and tier queues empty")
	got := testenv.Drain(t, s.conn, s.topo.Config().PoisonQueue)
	require.Len(t, got, wantPoison)
	return got
}

var errStockTimeout = errors.New("stock service: timeout")

func bothQueueTypes(t *testing.T, fn func(t *testing.T, quorum bool)) {
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) {
			t.Parallel()
			fn(t, quorum)
		})
	}
}

func TestStackTransientTwiceThenSuccess(t *testing.T) {
	t.Parallel()
	bothQueueTypes(t, func(t *testing.T, quorum bool) {
		s := newStack(t, rabbitmq.TopologyConfig{Quorum: quorum}, func(s *stack, msg *message.Message) error {
			if len(s.deliveries("evt-1")) <= 2 {
				return sluice.Transient(errStockTimeout)
			}
			return nil
		})
		s.publish(t, "evt-1")
		s.handled(t, "evt-1", 3)
		s.settled(t, 0)

		got := s.deliveries("evt-1")
		require.Len(t, got, 3, "handled on attempts 1, 2 and 3")
		last := got[2].Metadata
		require.Equal(t, "3", last.Get(sluice.AttemptKey))
		require.Equal(t, "500ms", last.Get(sluice.RetryTierKey), "the second copy went through tier 2")
		require.Equal(t, "200ms", got[1].Metadata.Get(sluice.RetryTierKey), "the first through tier 1")
		require.Contains(t, last.Get(sluice.LastErrorKey), "stock service: timeout")
		require.NotEmpty(t, last.Get(sluice.FirstFailedAtKey))
		// Each copy is a new publish without the broker's x-death: the attempt
		// count lives in Sluice's header, the death count is this copy's own.
		require.Equal(t, "1", last.Get(metakeys.DeathCount))
		require.Equal(t, s.topo.Tiers()[1].Topic, last.Get(metakeys.FirstDeathQueue))
		require.Equal(t, "expired", last.Get(metakeys.FirstDeathReason))
	})
}

func TestStackAlwaysTransientEndsInPoison(t *testing.T) {
	t.Parallel()
	bothQueueTypes(t, func(t *testing.T, quorum bool) {
		s := newStack(t, rabbitmq.TopologyConfig{Quorum: quorum}, func(*stack, *message.Message) error {
			return fmt.Errorf("calling postgres://app:hunter2@db/orders: %w", context.DeadlineExceeded)
		})
		const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		s.publish(t, "evt-2", sluice.EventTypeKey, "order.created", sluice.TraceparentKey, "00-"+traceID+"-00f067aa0ba902b7-01")
		s.handled(t, "evt-2", 4)
		got := s.settled(t, 1)
		require.Len(t, s.deliveries("evt-2"), 4, "the first attempt and one per tier")

		d := got[0]
		md, err := rabbitmq.Marshaler{}.Unmarshal(d)
		require.NoError(t, err)
		require.JSONEq(t, `{"orderId":"o-1"}`, string(md.Payload), "the original payload")
		for k, want := range map[string]string{
			metakeys.PoisonClass:      "exhausted",
			metakeys.PoisonConsumer:   "inventory",
			metakeys.PoisonQueue:      s.topo.Config().Queue,
			metakeys.PoisonExchange:   "",
			metakeys.PoisonRoutingKey: s.topo.Config().Queue,
			metakeys.PoisonTraceID:    traceID,
			sluice.EventIDKey:         "evt-2",
			sluice.EventTypeKey:       "order.created",
			sluice.RetryTierKey:       "1s",
			sluice.AttemptKey:         "4",
		} {
			require.Equal(t, want, md.Metadata.Get(k), k)
		}
		reason := md.Metadata.Get(metakeys.PoisonReason)
		require.Contains(t, reason, "retry budget spent after 4 attempts")
		require.Contains(t, reason, "postgres://app:xxxxx@db/orders", "the password is redacted")
		require.NotContains(t, reason, "hunter2")
		first, err := time.Parse(time.RFC3339Nano, md.Metadata.Get(sluice.FirstFailedAtKey))
		require.NoError(t, err)
		poisoned, err := time.Parse(time.RFC3339Nano, md.Metadata.Get(metakeys.PoisonedAt))
		require.NoError(t, err)
		require.GreaterOrEqual(t, poisoned.Sub(first), 1700*time.Millisecond, "the whole ladder was waited")
		for k := range d.Headers {
			require.NotContains(t, k, metakeys.DeliveryPrefix)
		}
	})
}

func TestStackPoisonAndRejected(t *testing.T) {
	t.Parallel()
	s := newStack(t, rabbitmq.TopologyConfig{}, func(_ *stack, msg *message.Message) error {
		switch msg.Metadata.Get(sluice.EventIDKey) {
		case "bad":
			return sluice.Poison(errors.New(`payload: missing field "sku"`))
		case "rejected":
			return sluice.Reject(errors.New("out of stock"))
		case "invariant":
			return sluice.Invariant(errors.New("order o-1 must exist"))
		case "forged":
			return sluice.Transient(errStockTimeout)
		}
		return nil
	})
	s.publish(t, "bad")
	s.publish(t, "rejected")
	s.publish(t, "invariant")
	s.publish(t, "forged", sluice.AttemptKey, "abc")
	for _, id := range []string{"bad", "rejected", "invariant", "forged"} {
		s.handled(t, id, 1)
	}
	got := s.settled(t, 3)

	require.Len(t, s.deliveries("bad"), 1, "poison is never retried")
	require.Len(t, s.deliveries("rejected"), 1, "a rejection is acked")
	classes := map[string]string{}
	for _, d := range got {
		md, err := rabbitmq.Marshaler{}.Unmarshal(d)
		require.NoError(t, err)
		classes[md.Metadata.Get(sluice.EventIDKey)] = md.Metadata.Get(metakeys.PoisonClass) + ": " + md.Metadata.Get(metakeys.PoisonReason)
	}
	require.Equal(t, map[string]string{
		"bad":       `poison: poison: payload: missing field "sku"`,
		"invariant": "invariant: invariant: order o-1 must exist",
		// A producer's sluice_attempt is not believed: a first attempt, the whole ladder.
		"forged": "exhausted: exhausted: retry budget spent after 4 attempts: transient: stock service: timeout",
	}, classes)
}

func TestStackPoisonQueueUnroutableLosesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, rabbitmq.TopologyConfig{}, func(*stack, *message.Message) error {
		return sluice.Poison(errors.New("malformed"))
	})
	ch := testenv.Channel(t, s.conn)
	_, err := ch.QueueDelete(s.topo.Config().PoisonQueue, false, false, false)
	require.NoError(t, err)

	s.publish(t, "evt-3")
	require.Eventually(t, func() bool { return len(s.deliveries("evt-3")) >= 3 }, time.Minute, 10*time.Millisecond,
		"the original is nacked and delivered again while the poison queue is unroutable")
	require.True(t, s.deliveries("evt-3")[2].Metadata.Get(metakeys.Redelivered) == "true")

	_, err = s.topo.Declare(t.Context(), s.conn)
	require.NoError(t, err, "the operator restores the poison queue")
	got := s.settled(t, 1)
	md, err := rabbitmq.Marshaler{}.Unmarshal(got[0])
	require.NoError(t, err)
	require.Equal(t, "evt-3", md.Metadata.Get(sluice.EventIDKey))
}

func TestStackRetryCopiesSkipOtherQueuesOfTheExchange(t *testing.T) {
	t.Parallel()
	ex := testenv.Name("ex")
	s := newStack(t, rabbitmq.TopologyConfig{Exchange: ex, BindingKey: "order.created"}, func(s *stack, msg *message.Message) error {
		if len(s.deliveries("evt-4")) <= 2 {
			return sluice.Transient(errStockTimeout)
		}
		return nil
	})
	other := declareQueue(t, "billing")
	require.NoError(t, testenv.Channel(t, s.conn).QueueBind(other, "order.created", ex, false, nil))

	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-4")
	require.NoError(t, newPublisher(t, ex).Publish("order.created", m))
	s.handled(t, "evt-4", 3)
	s.settled(t, 0)
	require.Len(t, s.deliveries("evt-4"), 3)
	require.Equal(t, 1, testenv.QueueDepth(t, s.conn, other), "the other consumer's queue got the original only")
	require.Equal(t, ex, s.deliveries("evt-4")[0].Metadata.Get(metakeys.SourceExchange))
}
