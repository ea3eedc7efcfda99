package router_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// TestShutdownOutlastingTheGraceSpendsNoAttempt: a deploy whose handler is
// still at work when the shutdown grace runs out gives the delivery back to
// its queue unprocessed — no attempt, no tier, no poison. (Before: the
// cancelled handler was Transient and parked in the first tier as attempt 2;
// on its last attempt it was poisoned as "exhausted: retry budget spent …
// context canceled". The retry stage now passes the delivery through before
// it reads the attempt, so the last attempt takes the same path.)
func TestShutdownOutlastingTheGraceSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	const attempt = "" // the first delivery: no attempt header
	queue := testenv.Name("deploy")
	tier := queue + ".retry.30s"
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", tier)
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology: rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{30 * time.Second}}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	inHandler := make(chan struct{}, 1)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "inventory",
		Handler: func(msg *message.Message) error {
			inHandler <- struct{}{}
			<-msg.Context().Done() // still at work when the grace runs out
			return fmt.Errorf("stock service: %w", msg.Context().Err())
		},
		Stages: router.Stages{
			ShutdownGrace: 50 * time.Millisecond,
			Poison:        &poison.Config{},
			Retry:         &retrytiers.Config{},
			Classify:      &stage.ClassifyConfig{},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)

	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	require.NoError(t, q.Publisher().Publish(queue, m))
	<-inHandler
	require.NoError(t, r.Close()) // the deploy
	require.NoError(t, <-done)
	require.NoError(t, q.Close())

	conn := testenv.AMQP(t)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == 1 }, time.Minute, 20*time.Millisecond,
		"back in its queue (tier %d, poison %d)", testenv.QueueDepth(t, conn, tier), testenv.QueueDepth(t, conn, queue+".poison"))
	require.Zero(t, testenv.QueueDepth(t, conn, tier), "no tier spent")
	require.Zero(t, testenv.QueueDepth(t, conn, queue+".poison"), "not poisoned")
	back := testenv.Drain(t, conn, queue)
	require.Len(t, back, 1)
	got, _ := back[0].Headers[sluice.AttemptKey].(string)
	require.Equal(t, attempt, got, "no attempt spent")
}
