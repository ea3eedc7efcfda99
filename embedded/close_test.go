package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// embeddedRouter runs cfg's handler on e and returns the router with the
// channel its Run returns on.
func embeddedRouter(t *testing.T, e *embedded.Broker, stages router.Stages, handler message.NoPublishHandlerFunc) (*message.Router, <-chan error, testenv.ClosingLogger) {
	t.Helper()
	logger := testenv.NewClosingLogger()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "inventory", Handler: handler, Stages: stages})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	return r, done, logger
}

// The router closes in the middle of 1,000 deliveries: every one is either
// processed or named by Embedded.Close, none is processed twice, and no
// handler runs once the router's Close has returned — its subscription has
// closed its channel, so nothing more can start.
func TestEmbeddedCloseMidLoadAccountsForEveryDelivery(t *testing.T) {
	t.Parallel()
	const events, passing, inFlight = 1000, 200, 16
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Hour}, MaxInFlight: inFlight})
	require.NoError(t, err)

	var (
		mu        sync.Mutex
		processed = map[string]int{}
		arrivals  atomic.Int64
		running   atomic.Int64
		closed    atomic.Bool // the router's Close has returned
		late      atomic.Int64
		held      = make(chan struct{}, events)
		release   = make(chan struct{})
	)
	r, done, logger := embeddedRouter(t, e, router.Stages{
		Poison: &poison.Config{}, Retry: &retrytiers.Config{Env: sluice.Env{PublishBackoff: time.Millisecond}}, Classify: &stage.ClassifyConfig{},
	}, func(m *message.Message) error {
		running.Add(1)
		defer running.Add(-1)
		if closed.Load() {
			late.Add(1)
		}
		if arrivals.Add(1) > passing { // mid-load: the rest wait for the close
			held <- struct{}{}
			<-release
		}
		mu.Lock()
		defer mu.Unlock()
		if closed.Load() {
			late.Add(1)
		}
		processed[m.Metadata.Get(sluice.EventIDKey)]++
		return nil
	})
	testenv.PublishEvents(t, e.PubSub(), "orders", events)
	for range inFlight { // passing processed, inFlight held in their handlers
		<-held
	}

	closeErr := make(chan error, 1)
	go func() { closeErr <- r.Close() }()
	<-logger.Closing // the router's Close has begun
	close(release)   // the held handlers commit while the router drains
	require.NoError(t, <-closeErr)
	closed.Store(true)
	require.NoError(t, <-done)

	require.Zero(t, running.Load(), "no handler runs after the router's Close returned")
	require.Zero(t, embedded.Subscriptions(e), "the handler's subscription closed its channel: nothing more can start")
	mu.Lock()
	atClose := len(processed)
	mu.Unlock()

	err = e.Close()
	var unfinished *embedded.UnfinishedError
	require.ErrorAs(t, err, &unfinished)
	require.Empty(t, unfinished.InFlight, "the drain saw every handler out")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, atClose, len(processed), "nothing was processed after Close")
	require.Zero(t, late.Load(), "no handler started or committed after Close")
	require.GreaterOrEqual(t, len(processed), passing+inFlight, "the held handlers committed in the drain")
	require.Equal(t, events, len(processed)+len(unfinished.Queued), "processed + reported not finished")
	for id, n := range processed {
		require.Equal(t, 1, n, "%s processed once", id)
	}
	for _, m := range unfinished.Queued {
		id := m.Metadata.Get(sluice.EventIDKey)
		require.Zero(t, processed[id], "%s is both processed and reported", id)
	}
	require.ErrorContains(t, err, fmt.Sprintf("%d deliveries not acked", events-len(processed)))
}

// Deliveries the brake holds while the router closes are nacked back by
// the shutdown: Close counts them, beside the copies that reached a tier
// before the brake engaged — none vanishes.
func TestEmbeddedCloseReportsDeliveriesNackedWhileTheRouterCloses(t *testing.T) {
	t.Parallel()
	const events = 10
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Hour}})
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	var handled atomic.Int64
	r, done, _ := embeddedRouter(t, e, router.Stages{
		ShutdownGrace: 50 * time.Millisecond,
		Poison:        &poison.Config{}, Retry: &retrytiers.Config{Env: sluice.Env{PublishBackoff: time.Millisecond}}, Classify: &stage.ClassifyConfig{},
		Brake: &brake.Config{Window: 2, FailureRatio: 1, CoolDown: time.Hour, Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}},
	}, func(*message.Message) error {
		handled.Add(1)
		return fmt.Errorf("inventory service: %w", syscall.ECONNREFUSED)
	})
	testenv.PublishEvents(t, e.PubSub(), "orders", events)
	require.Eventually(t, func() bool { return testenv.CounterSum(t, reader, telemetry.MetricBrakeTransitions) >= 1 }, time.Minute, time.Millisecond,
		"the brake engaged: the deliveries after it wait in the stage")
	require.NoError(t, r.Close())
	require.NoError(t, <-done)

	parked := e.PendingRetries() // the failures before the brake engaged
	err = e.Close()
	var unfinished *embedded.UnfinishedError
	require.ErrorAs(t, err, &unfinished)
	require.Empty(t, e.Poisoned())
	require.Equal(t, events, parked+len(unfinished.Queued), "every delivery is in a tier or reported")
	require.NotZero(t, len(unfinished.Queued), "the brake held some")
	if parked > 0 {
		require.ErrorContains(t, err, fmt.Sprintf("%d still waiting at Close", parked))
	}
	// Issue 28.11: the tiers' copies dropped at Close are handed back too.
	// Before, they were only counted.
	require.Len(t, unfinished.Tiers, parked, "each retry copy waiting at Close is handed back")
	require.Len(t, slices.Concat(unfinished.Queued, unfinished.InFlight, unfinished.Tiers), events)
}

// The poison publisher returns once the copy is stored, as
// Endpoints.PoisonPublisher promises: Poisoned shows it at once.
func TestEmbeddedPoisonPublishReturnsOnceStored(t *testing.T) {
	t.Parallel()
	e, err := embedded.New(embedded.Config{Topic: "orders"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	ep := e.Endpoints()
	for i := range 100 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		require.NoError(t, ep.PoisonPublisher.Publish(ep.PoisonTopic, m))
		poisoned := e.Poisoned()
		require.Len(t, poisoned, i+1)
		require.Equal(t, fmt.Sprint("evt-", i), poisoned[i].Metadata.Get(sluice.EventIDKey))
	}
}

// Deliveries published before any handler subscribes wait for it: the
// embedded broker drops nothing for want of a subscriber.
func TestEmbeddedKeepsDeliveriesPublishedBeforeTheHandler(t *testing.T) {
	t.Parallel()
	e, err := embedded.New(embedded.Config{Topic: "orders"})
	require.NoError(t, err)
	testenv.PublishEvents(t, e.PubSub(), "orders", 20)
	var handled atomic.Int64
	r, done, _ := embeddedRouter(t, e, router.Stages{Classify: &stage.ClassifyConfig{}}, func(*message.Message) error {
		handled.Add(1)
		return nil
	})
	require.Eventually(t, func() bool { return handled.Load() == 20 }, time.Minute, time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, e.Close())
}

// The shape: 1,000 published, then both Close calls at once, the
// handlers busy. Nothing is buffered for the router to start after its
// Close: no handler runs once it returned, and every event is processed or
// reported.
func TestEmbeddedCloseRightAfterPublishing(t *testing.T) {
	t.Parallel()
	const events = 1000
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Hour}})
	require.NoError(t, err)
	var processed, running, late atomic.Int64
	var closed atomic.Bool
	r, done, _ := embeddedRouter(t, e, router.Stages{
		Poison: &poison.Config{}, Retry: &retrytiers.Config{Env: sluice.Env{PublishBackoff: time.Millisecond}}, Classify: &stage.ClassifyConfig{},
	}, func(*message.Message) error {
		running.Add(1)
		defer running.Add(-1)
		for range 100 {
			runtime.Gosched() // busy, without a timer
		}
		if closed.Load() {
			late.Add(1)
		}
		processed.Add(1)
		return nil
	})
	testenv.PublishEvents(t, e.PubSub(), "orders", events)
	require.NoError(t, r.Close())
	closed.Store(true)
	require.NoError(t, <-done)
	require.Zero(t, running.Load(), "no handler runs after the router's Close returned")
	require.Zero(t, embedded.Subscriptions(e), "nothing more can start")
	atClose := processed.Load()

	err = e.Close()
	reported := 0
	var unfinished *embedded.UnfinishedError
	if errors.As(err, &unfinished) {
		require.Empty(t, unfinished.InFlight)
		reported = len(unfinished.Queued)
	} else {
		require.NoError(t, err)
	}
	require.Equal(t, atClose, processed.Load())
	require.Zero(t, late.Load())
	require.Equal(t, int64(events), processed.Load()+int64(reported), "processed + reported not finished")
}

// A handler that outlasts the drain (it ignores its context) is reported
// by Close as still in a handler, not counted as finished.
func TestEmbeddedCloseReportsAHandlerOutlastingTheDrain(t *testing.T) {
	t.Parallel()
	e, err := embedded.New(embedded.Config{Topic: "orders", DrainTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 100 * time.Millisecond}, watermill.NopLogger{})
	require.NoError(t, err)
	held, release := make(chan struct{}), make(chan struct{})
	returned := make(chan struct{})
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "inventory", Stages: router.Stages{ShutdownGrace: -1},
		Handler: func(*message.Message) error {
			defer close(returned)
			close(held)
			<-release // deaf to its context
			return nil
		}})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	testenv.PublishEvents(t, e.PubSub(), "orders", 1)
	<-held
	require.ErrorContains(t, r.Close(), "router close timeout", "the handler is still running")
	require.NoError(t, <-done)

	err = e.Close()
	var unfinished *embedded.UnfinishedError
	require.ErrorAs(t, err, &unfinished)
	require.Len(t, unfinished.InFlight, 1)
	require.Empty(t, unfinished.Queued)
	require.ErrorContains(t, err, "1 still in a handler: evt-0")
	close(release)
	<-returned
	require.ErrorAs(t, e.Close(), new(*embedded.UnfinishedError), "a second Close returns the same report")
}
