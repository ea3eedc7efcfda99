package router_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
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

// fullQueue makes queue refuse new messages (a reject-publish length limit
// of 0, by policy: the queue is empty, so nothing is dropped) until the
// returned function clears the policy.
func fullQueue(t *testing.T, queue string) (clear func()) {
	t.Helper()
	return testenv.Policy(t, "sluice-test-full-"+queue, "^"+regexp.QuoteMeta(queue)+"$", `{"max-length":0,"overflow":"reject-publish"}`, 100)
}

func runRouter(t *testing.T, r *message.Router) {
	t.Helper()
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })
}

// A poison copy the poison queue refuses (full) waits in the first tier
// instead of holding its delivery for the backoff and coming back at the
// head of the queue: the good messages behind it flow, and once the poison
// queue takes messages again the copy lands there, diagnosed, without the
// handler running a second time.
func TestRefusedPoisonCopyIsParked(t *testing.T) {
	t.Parallel()
	const good = 300
	queue := testenv.Name("parked")
	q := newRabbitMQ(t, queue, 300*time.Millisecond)
	clearPolicy := fullQueue(t, q.Topology().Config().PoisonQueue)
	reader := sdkmetric.NewManualReader()
	var handledGood, handledBad atomic.Int64
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "parked",
		Handler: func(msg *message.Message) error {
			if msg.Metadata.Get(sluice.EventIDKey) == "bad" {
				handledBad.Add(1)
				return sluice.Poison(errors.New("unknown version 7"))
			}
			handledGood.Add(1)
			return nil
		},
		Stages: router.Stages{
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		},
	})
	require.NoError(t, err)
	publish := func(id string) {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, id)
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	// The bad one comes from a foreign (Spring) producer: a gzip body and
	// AMQP properties, which must survive the parking and the return.
	body := []byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xffversion-7")
	require.NoError(t, testenv.Channel(t, testenv.AMQP(t)).PublishWithContext(t.Context(), "", queue, false, false, amqp.Publishing{
		ContentType: "application/json", ContentEncoding: "gzip", CorrelationId: "corr-7", MessageId: "m-7", Type: "OrderCreated",
		AppId: "spring-orders", Headers: amqp.Table{sluice.EventIDKey: "bad", "__TypeId__": "com.example.OrderCreated"}, Body: body,
	}))
	for i := range good {
		publish(fmt.Sprint("good-", i))
	}
	runRouter(t, r)

	require.NoError(t, testenv.AwaitCount(good, time.Minute, 10*time.Minute, func() int { return int(handledGood.Load()) }),
		"every good event handled beside the parked one")
	require.Eventually(t, func() bool { return testenv.CounterSum(t, reader, telemetry.MetricPoisonParked) >= 2 }, time.Minute, 10*time.Millisecond,
		"refused, parked, back after the tier's delay, refused again, parked again")
	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue))

	clearPolicy()
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue) == 1 }, time.Minute, 10*time.Millisecond)
	copies := testenv.Drain(t, conn, q.Topology().Config().PoisonQueue)
	require.Len(t, copies, 1)
	c, err := rabbitmq.Marshaler{}.Unmarshal(copies[0])
	require.NoError(t, err)
	require.Equal(t, "bad", c.Metadata.Get(sluice.EventIDKey))
	d := copies[0]
	require.Equal(t, body, d.Body, "the body, byte for byte")
	require.Equal(t, []string{"application/json", "gzip", "corr-7", "m-7", "OrderCreated", "spring-orders", "com.example.OrderCreated"},
		[]string{d.ContentType, d.ContentEncoding, d.CorrelationId, d.MessageId, d.Type, d.AppId, fmt.Sprint(d.Headers["__TypeId__"])},
		"the producer's properties survived the parking")
	require.Equal(t, "poison", c.Metadata.Get(metakeys.PoisonClass))
	require.Contains(t, c.Metadata.Get(metakeys.PoisonReason), "unknown version 7")
	require.Empty(t, c.Metadata.Get(metakeys.PoisonParked), "the copy in the poison queue is not marked parked")
	require.Equal(t, int64(1), handledBad.Load(), "the parked copy came back and was isolated without running the handler")
	require.Eventually(t, func() bool { return testenv.CounterSum(t, reader, telemetry.MetricPoisoned) == 1 }, time.Minute, 5*time.Millisecond,
		"counted once isolated (after the confirm the test may see first)")
}

// A retry copy whose tier refuses it (the queue was deleted) waits in
// another tier instead of being nacked to the head of the queue.
func TestRefusedTierCopyWaitsInAnotherTier(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("tierless")
	q := newRabbitMQ(t, queue, 100*time.Millisecond, 200*time.Millisecond)
	conn := testenv.AMQP(t)
	_, err := testenv.Channel(t, conn).QueueDelete(q.Topology().Tiers()[0].Topic, false, false, false)
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	var attempts []string
	var mu sync.Mutex
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q, Name: "tierless",
		Handler: func(msg *message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, msg.Metadata.Get(sluice.AttemptKey)+"/"+msg.Metadata.Get(sluice.RetryTierKey))
			if len(attempts) == 1 {
				return sluice.Transient(errors.New("stock service timeout"))
			}
			return nil
		},
		Stages: router.Stages{
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
			Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
		},
	})
	require.NoError(t, err)
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	require.NoError(t, q.Publisher().Publish(queue, m))
	runRouter(t, r)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(attempts) == 2 }, time.Minute, 5*time.Millisecond)
	mu.Lock()
	require.Equal(t, []string{"/", "2/200ms"}, attempts, "the copy waited in the 200ms tier, its attempt counted once")
	mu.Unlock()
	// Counted once the tier's publish is confirmed, which the copy's return
	// from its 200 ms tier may overtake on a loaded machine: waited for.
	require.Eventually(t, func() bool {
		return slices.Equal([]string{"200ms"}, testenv.AttributeValues(t, reader, telemetry.MetricRetries, "sluice.tier"))
	}, 2*time.Minute, 5*time.Millisecond, "the retry counted in the 200ms tier: %v", testenv.AttributeValues(t, reader, telemetry.MetricRetries, "sluice.tier"))
	require.Zero(t, testenv.QueueDepth(t, conn, q.Topology().Config().PoisonQueue))
}
