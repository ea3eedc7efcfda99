package brake_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errDown = fmt.Errorf("dial: %w", syscall.ECONNREFUSED)

// run passes one delivery through the stage with handler result err.
func run(b *brake.Brake, err error) error {
	msg := message.NewMessage(watermill.NewUUID(), nil)
	_, got := b.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, err })(msg)
	return got
}

func newBrake(t *testing.T, cfg brake.Config) (*brake.Brake, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg.Name = "orders"
	b, err := brake.New(cfg)
	require.NoError(t, err)
	return b, reader
}

func awaitState(t *testing.T, b *brake.Brake, want brake.State) {
	t.Helper()
	require.Eventually(t, func() bool { return b.State() == want }, time.Minute, time.Millisecond, "brake never %s", want)
}

// The brake engages at the FailureRatio of the Window, holding the failure
// that tripped it and every counted failure after it (sluice.ErrHeld, which
// the Classifier leaves unclassified, so no stage acts on it), and — with a
// pausing subscriber — every delivery until the probe.
func TestEngagesHoldsProbesAndReleases(t *testing.T) {
	t.Parallel()
	// Cool-downs long enough that no stall of a busy machine ends one
	// between two assertions.
	b, reader := newBrake(t, brake.Config{Window: 10, FailureRatio: 0.5, CoolDown: 300 * time.Millisecond, MaxCoolDown: 900 * time.Millisecond, Pausing: true})
	for range 6 {
		require.NoError(t, run(b, nil))
	}
	for i := range 4 {
		err := run(b, sluice.Transient(errDown))
		require.NotErrorIs(t, err, sluice.ErrHeld, "failure %d is the retry stage's", i+1)
		require.Equal(t, brake.Released, b.State())
	}
	err := run(b, sluice.Transient(errDown))
	require.ErrorIs(t, err, sluice.ErrHeld, "the fifth of the last ten trips it and is held")
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "the handler's error is kept")
	require.Equal(t, sluice.Unclassified, sluice.DefaultClassifier().Classify(err))
	engaged, changed := b.Engaged()
	require.True(t, engaged)
	require.ErrorIs(t, run(b, nil), sluice.ErrHeld, "engaged: nothing runs")

	<-changed // the cool-down ends: probing
	awaitState(t, b, brake.Probing)
	start := time.Now() // before the cool-down is armed: a lower bound no stall can break
	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld, "the failed probe is held")
	require.Equal(t, brake.Engaged, b.State())
	awaitState(t, b, brake.Probing)
	require.GreaterOrEqual(t, time.Since(start), 600*time.Millisecond, "the cool-down doubled")
	require.NoError(t, run(b, nil), "the probe succeeds")
	require.Equal(t, brake.Released, b.State())
	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld, "released but wary: a failure of the kind it saw is held")
	require.Equal(t, brake.Released, b.State(), "one failure does not engage it")
	for range 10 {
		require.NoError(t, run(b, nil))
	}
	require.NotErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld, "a whole window without one: the retry stage's again")

	require.Equal(t, int64(2), stateCount(t, reader, "engaged"))
	require.Equal(t, int64(2), stateCount(t, reader, "probing"))
	require.Equal(t, int64(1), stateCount(t, reader, "released"))
	require.Equal(t, int64(4), testenv.CounterSum(t, reader, telemetry.MetricBrakeHeld))
}

func stateCount(t *testing.T, reader *sdkmetric.ManualReader, state string) int64 {
	t.Helper()
	return testenv.CounterWhere(t, reader, telemetry.MetricBrakeTransitions, string(telemetry.AttrBrakeState), state)
}

// Poison, Invariant, Rejected and Exhausted failures never count, nor do
// Transient failures Match refuses.
func TestOnlyMatchingTransientFailuresCount(t *testing.T) {
	t.Parallel()
	b, reader := newBrake(t, brake.Config{Window: 4, FailureRatio: 0.5, Match: brake.MatchUnreachable})
	for range 100 {
		for _, err := range []error{
			sluice.Poison(errors.New("bad json")), sluice.Invariant(errors.New("no order")),
			sluice.Reject(errors.New("sold out")), sluice.NewFailure(sluice.ClassExhausted, errDown),
			sluice.Transient(context.DeadlineExceeded), // a slow message, not an outage
		} {
			require.NotErrorIs(t, run(b, err), sluice.ErrHeld)
		}
	}
	require.Equal(t, brake.Released, b.State())
	require.Zero(t, testenv.CounterSum(t, reader, telemetry.MetricBrakeTransitions))
	require.ErrorIs(t, run(b, errDown), errDown, "an unclassified refused connection is Transient")
	require.ErrorIs(t, run(b, &net.OpError{Op: "dial", Err: errors.New("no route")}), sluice.ErrHeld)
}

// Without a pausing subscriber (GoChannel, watermill-amqp's), a delivery
// waits in the stage while the brake is engaged, and one of the waiting
// becomes the probe; the others wait for its verdict.
func TestWithoutPausingDeliveriesWaitForTheProbe(t *testing.T) {
	t.Parallel()
	b, _ := newBrake(t, brake.Config{Window: 1, FailureRatio: 1, CoolDown: 500 * time.Millisecond})
	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld)
	ran := make(chan brake.State, 3) // the brake's state as each handler runs
	results := make(chan error, 3)
	for range 3 {
		go func() {
			msg := message.NewMessage(watermill.NewUUID(), nil)
			_, err := b.Middleware(func(*message.Message) ([]*message.Message, error) {
				ran <- b.State()
				return nil, nil
			})(msg)
			results <- err
		}()
	}
	for range 3 {
		require.NoError(t, <-results)
	}
	close(ran)
	var states []brake.State
	for s := range ran {
		states = append(states, s)
	}
	require.ElementsMatch(t, []brake.State{brake.Probing, brake.Released, brake.Released}, states,
		"nothing runs while engaged: one probe, then the others once released")
	require.Equal(t, brake.Released, b.State())

	// A waiting delivery whose context ends is held, not run.
	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld)
	ctx, cancel := context.WithCancel(t.Context())
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.SetContext(ctx)
	cancel()
	_, err := b.Middleware(func(*message.Message) ([]*message.Message, error) { panic("must not run") })(msg)
	require.ErrorIs(t, err, sluice.ErrHeld)
	require.ErrorIs(t, err, context.Canceled)
	awaitState(t, b, brake.Probing)
	require.NoError(t, run(b, nil))
}

// A probe whose failure says nothing about the dependency (a poison
// message) lets the next delivery probe.
func TestAPoisonProbeLetsTheNextOneProbe(t *testing.T) {
	t.Parallel()
	b, _ := newBrake(t, brake.Config{Window: 1, FailureRatio: 1, CoolDown: 10 * time.Millisecond, Pausing: true})
	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld)
	awaitState(t, b, brake.Probing)
	err := run(b, sluice.Poison(errors.New("bad json")))
	require.NotErrorIs(t, err, sluice.ErrHeld, "the poison stage isolates it")
	require.Equal(t, brake.Probing, b.State())
	require.NotErrorIs(t, run(b, sluice.Reject(errors.New("sold out"))), sluice.ErrHeld)
	require.Equal(t, brake.Released, b.State(), "a rejection committed: the dependency answers")
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  brake.Config
		want string
	}{
		{brake.Config{Window: -1}, "Config.Window must be positive"},
		{brake.Config{FailureRatio: 1.5}, "Config.FailureRatio must be in (0, 1]"},
		{brake.Config{FailureRatio: -0.1}, "Config.FailureRatio must be in (0, 1]"},
		{brake.Config{CoolDown: -time.Second}, "Config.CoolDown must be positive"},
		{brake.Config{CoolDown: time.Minute, MaxCoolDown: time.Second}, "Config.MaxCoolDown (1s) must be at least CoolDown (1m0s)"},
	} {
		_, err := brake.New(tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
}

// logs captures the brake's log lines.
type logs struct {
	watermill.NopLogger
	mu    sync.Mutex
	lines []string
}

func (l *logs) add(level, msg string, err error, f watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("%s %s err=%v %v", level, msg, err, f))
}
func (l *logs) Error(msg string, err error, f watermill.LogFields) { l.add("error", msg, err, f) }
func (l *logs) Info(msg string, f watermill.LogFields)             { l.add("info", msg, nil, f) }

// Each change of state is logged once (engaged at error level with the
// error that tripped it, redacted), and spanned.
func TestStateChangesAreLoggedAndSpanned(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	l := &logs{}
	b, err := brake.New(brake.Config{Name: "orders", Window: 2, FailureRatio: 1, CoolDown: 10 * time.Millisecond, Pausing: true,
		Env: sluice.Env{Logger: l, TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))}})
	require.NoError(t, err)
	secret := fmt.Errorf("dial postgres://app:TopSecret1@db:5432/orders: %w", syscall.ECONNREFUSED)
	_ = run(b, sluice.Transient(secret)) // held: the brake trips
	_ = run(b, sluice.Transient(secret))
	awaitState(t, b, brake.Probing)
	require.NoError(t, run(b, nil))

	l.mu.Lock()
	require.Len(t, l.lines, 3, "%v", l.lines)
	require.Contains(t, l.lines[0], "error Brake engaged")
	require.Contains(t, l.lines[0], "connection refused")
	require.Contains(t, l.lines[0], "failures:2 of the last 2 deliveries")
	require.NotContains(t, l.lines[0], "TopSecret1")
	require.Contains(t, l.lines[1], "info Brake probing")
	require.Contains(t, l.lines[2], "info Brake released")
	l.mu.Unlock()
	var names []string
	for _, s := range spans.Ended() {
		names = append(names, s.Name())
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				require.NotContains(t, a.Value.String(), "TopSecret1")
			}
		}
	}
	require.Equal(t, []string{"sluice.brake engaged", "sluice.brake probing", "sluice.brake released"}, names)
	require.Equal(t, codes.Error, spans.Ended()[0].Status().Code)
}
