package router_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// Issue 18 item 3: a message its producer could publish, with headers
// 100 bytes short of the frame (~130,950 bytes), fails in its handler
// beside 50 good messages failing once. Its copies (tier, then poison) with
// Sluice's additions would exceed the negotiated frame_max: the publisher
// refuses them before sending (before the fix the broker closed the shared
// publisher connection with FRAME_ERROR, failing the other copies, and the
// message came back forever). The retry stage poisons it, the poison stage
// leaves out its largest header and isolates it with its diagnosis; the 50
// go through their tier and are processed; the publisher never reconnects.
func TestCopyOverTheFrameIsIsolatedAndThePublisherStaysUp(t *testing.T) {
	t.Parallel()
	const good = 50
	queue := testenv.Name("frame")
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL, MeterProvider: mp},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{200 * time.Millisecond}},
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, q.Topology().Config().PoisonQueue, q.Topology().Tiers()[0].Topic)
	t.Cleanup(func() { _ = q.Close() })

	var bigCalls atomic.Int64
	var mu sync.Mutex
	processed := map[string]int{}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "frame",
		Handler: func(msg *message.Message) error {
			id := msg.Metadata.Get(sluice.EventIDKey)
			if id == "big" {
				bigCalls.Add(1)
				return sluice.Transient(errors.New("stock service: timeout"))
			}
			if msg.Metadata.Get(sluice.AttemptKey) == "" {
				return sluice.Transient(errors.New("stock service: timeout"))
			}
			mu.Lock()
			processed[id]++
			mu.Unlock()
			return nil
		},
		Stages: router.Stages{
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Env: sluice.Env{MeterProvider: mp},
		},
	})
	require.NoError(t, err)

	// The producer's message: its content header 100 bytes under the frame.
	conn := testenv.AMQP(t)
	maxHeader := conn.Config.FrameSize - 8
	require.Positive(t, maxHeader)
	headers := amqp.Table{sluice.EventIDKey: "big"}
	const fixed = 2 + 2 + 8 + 2 + 1 // class, weight, body size, flags; delivery mode
	tableFixed := 4 + (1 + len(sluice.EventIDKey) + 5 + len("big")) + (1 + len("blob") + 5)
	headers["blob"] = strings.Repeat("x", maxHeader-100-fixed-tableFixed)
	producer := testenv.Channel(t, conn)
	require.NoError(t, producer.Confirm(false))
	confirm, err := producer.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, Headers: headers, Body: []byte(`{}`),
	})
	require.NoError(t, err)
	ok, err := confirm.WaitContext(t.Context())
	require.NoError(t, err)
	require.True(t, ok, "the producer's message fits the frame: the broker takes it")

	for i := range good {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("good-", i))
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	runRouter(t, r)

	if err := testenv.AwaitCount(good, 2*time.Minute, 10*time.Minute, func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(processed)
	}); err != nil {
		t.Fatalf("every good message went through its tier and was processed: %v; %s", err,
			testenv.QueueDepths(t, conn, queue, q.Topology().Tiers()[0].Topic, q.Topology().Config().PoisonQueue))
	}
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue) == 1 },
		2*time.Minute, 10*time.Millisecond, "the big message is isolated")
	require.Eventually(t, func() bool {
		return testenv.QueueDepth(t, conn, queue) == 0 && testenv.QueueDepth(t, conn, q.Topology().Tiers()[0].Topic) == 0
	}, time.Minute, 10*time.Millisecond)

	copies := testenv.Drain(t, conn, q.Topology().Config().PoisonQueue)
	require.Len(t, copies, 1)
	c, err := rabbitmq.Marshaler{}.Unmarshal(copies[0])
	require.NoError(t, err)
	md := c.Metadata
	require.Equal(t, "big", md.Get(sluice.EventIDKey))
	require.Equal(t, "poison", md.Get(metakeys.PoisonClass))
	require.Contains(t, md.Get(metakeys.PoisonReason), "frame_max", "the diagnosis says why")
	require.Contains(t, md.Get(metakeys.PoisonReason), "stock service: timeout", "and what the handler said")
	require.LessOrEqual(t, len(md.Get(metakeys.PoisonReason)), 1024, "the reason is cut to 1 KiB")
	require.Equal(t, "blob", md.Get(metakeys.PoisonDropped), "the largest header is left out, and named")
	require.NotContains(t, md, "blob")
	require.Equal(t, queue, md.Get(metakeys.PoisonQueue))
	require.Equal(t, int64(1), bigCalls.Load(), "isolated at its first failure: never a nack loop")

	mu.Lock()
	for id, n := range processed {
		require.Equal(t, 1, n, id)
	}
	mu.Unlock()
	require.Equal(t, int64(good), testenv.CounterSum(t, reader, telemetry.MetricRetries))
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricPublishReconnects), "the shared publisher's connection never closed")
}
