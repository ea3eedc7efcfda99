package rabbitmq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// brokerTiers are the tiers of newBrokerStack: short, so a ladder is run
// through in about a second.
var brokerTiers = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}

// newBrokerStack is the whole stack as users assemble it — router.Add with
// rabbitmq.NewBroker: poison, retry tiers, classify, an in-memory inbox,
// recoverer — on a queue of t's own, with stages edited by opts. The
// returned stack records every delivery the handler sees.
func newBrokerStack(t *testing.T, handler func(msg *message.Message) error, opts ...func(*router.Stages)) *stack {
	t.Helper()
	queue := testenv.Name("trust")
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: queue, TierDelays: brokerTiers},
	})
	require.NoError(t, err)
	names := []string{queue, b.Topology().Config().PoisonQueue}
	for _, tier := range b.Topology().Tiers() {
		names = append(names, tier.Topic)
	}
	testenv.DeleteQueuesAtEnd(t, names...)
	s := &stack{topo: b.Topology(), conn: testenv.AMQP(t), pub: b.Publisher(), calls: map[string][]*message.Message{}}

	stages := router.Stages{
		Poison:    &poison.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}},
		Retry:     &retrytiers.Config{Env: sluice.Env{PublishBackoff: 50 * time.Millisecond}},
		Classify:  &stage.ClassifyConfig{},
		Inbox:     &deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "inventory"},
		Recoverer: &stage.RecovererConfig{},
	}
	for _, o := range opts {
		o(&stages)
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b, Name: "inventory", Stages: stages,
		Handler: func(msg *message.Message) error {
			s.mu.Lock()
			id := msg.Metadata.Get(sluice.EventIDKey)
			s.calls[id] = append(s.calls[id], msg.Copy())
			s.mu.Unlock()
			return handler(msg)
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			require.NoError(t, r.Close())
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(func() {
		s.stop()
		require.NoError(t, b.Close())
	})
	return s
}

// publishRaw publishes p into the stack's queue as a foreign producer does:
// its headers and properties exactly as given, on a channel of its own.
func (s *stack) publishRaw(t *testing.T, p amqp.Publishing) {
	t.Helper()
	if p.Body == nil {
		p.Body = []byte(`{"orderId":"o-1"}`)
	}
	ch, err := s.conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(t, ch.Confirm(false))
	c, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", s.topo.Config().Queue, true, false, p)
	require.NoError(t, err)
	ok, err := c.WaitContext(t.Context())
	require.NoError(t, err)
	require.True(t, ok, "the broker confirmed the publish")
}
