package router_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
	"github.com/sluicemq/sluice/stage"
)

// TestProducedMessageCarryingTheHandlersContextIsPublished: a publishing
// handler whose produced event carries its context (evt.SetContext(ctx), as
// examples/orders does) has it published by Watermill after the stack
// returned. The shutdown grace stage cancelled that context when the handler
// returned, so rabbitmq.Publisher refused every such publish ("context
// canceled"): the delivery was nacked, its redelivery a duplicate, and the
// event never published.
func TestProducedMessageCarryingTheHandlersContextIsPublished(t *testing.T) {
	t.Parallel()
	db, schema, store := inbox(t)
	queue, out := testenv.Name("produce"), testenv.Name("produced")
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.30s", queue+".retry.5m", queue+".retry.30m", out)
	conn := testenv.AMQP(t)
	_, err := testenv.Channel(t, conn).QueueDeclare(out, true, false, false, false, nil)
	require.NoError(t, err)

	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}, Topology: rabbitmq.TopologyConfig{Queue: queue}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	var calls atomic.Int64
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "inventory",
		PublishingHandler: func(msg *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			ctx := msg.Context()
			_, err := sluicesql.TxFromContext(ctx).ExecContext(ctx, // the driver looks at the context
				fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), msg.Metadata.Get(sluice.EventIDKey))
			if err != nil {
				return nil, err
			}
			evt := message.NewMessage(watermill.NewUUID(), []byte(`{"reserved":true}`))
			evt.SetContext(ctx)
			return []*message.Message{evt}, nil
		},
		PublishTopic: out,
		Publisher:    q.Publisher(),
		// This path, not the outbox: Watermill publishes after the commit.
		PublishAtMostOnce: true,
		Stages: router.Stages{
			Classify: &stage.ClassifyConfig{},
			Inbox:    &deduplication.Config{Store: store, Consumer: "inventory"},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)

	const events = 5
	for i := range events {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, out) == events }, time.Minute, 20*time.Millisecond,
		"every produced event published (handler calls: %d)", calls.Load())
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == 0 }, time.Minute, 20*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, q.Close())
	require.Equal(t, int64(events), calls.Load(), "each handler ran once: no delivery was nacked for its publish")
	var n int
	require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
	require.Equal(t, events, n)
}
