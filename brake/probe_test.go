package brake_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
)

// With a Probe, the end of a cool-down calls it while the brake stays
// engaged — the subscriber takes nothing — and a failed Probe starts
// another, doubled cool-down instead of letting a delivery through: 20
// failed probes, no delivery run, one engagement. Once Probe passes, one
// delivery probes; its failure engages the brake again (Probe first
// again), its success releases it.
func TestProbeKeepsTheBrakeEngagedWithoutADelivery(t *testing.T) {
	t.Parallel()
	const failures = 20
	var calls, calledWhileReleased, ranDuringProbe atomic.Int64
	passing := make(chan struct{})
	var b *brake.Brake
	probeCfg := brake.Config{Window: 1, FailureRatio: 1, CoolDown: 5 * time.Millisecond, MaxCoolDown: 20 * time.Millisecond, Pausing: true,
		Probe: func(ctx context.Context) error {
			if engaged, _ := b.Engaged(); !engaged {
				calledWhileReleased.Add(1)
			}
			// A delivery arriving meanwhile is held: the brake is engaged
			// until this Probe returns.
			if err := run(b, nil); !errors.Is(err, sluice.ErrHeld) {
				ranDuringProbe.Add(1)
			}
			if calls.Add(1) == failures {
				close(passing)
			}
			select {
			case <-passing:
				if calls.Load() > failures {
					return nil
				}
			default:
			}
			return errDown
		}}
	b, reader := newBrake(t, probeCfg)
	t.Cleanup(func() { require.NoError(t, b.Close()) })

	start := time.Now()
	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld, "the brake trips")
	<-passing // the 20th probe is failing
	awaitState(t, b, brake.Probing)
	// Cool-downs of 10ms, then 20ms (the most) after each failed probe:
	// timers never fire early.
	require.GreaterOrEqual(t, time.Since(start), 5*time.Millisecond+10*time.Millisecond+(failures-2)*20*time.Millisecond)
	require.True(t, b.Probing())
	require.Equal(t, int64(failures+1), calls.Load())
	require.Zero(t, calledWhileReleased.Load())
	require.Zero(t, ranDuringProbe.Load(), "engaged while probing the dependency: no delivery runs")
	require.Equal(t, int64(1), stateCount(t, reader, "engaged"), "a failed Probe is no new engagement")
	require.Equal(t, int64(failures), dependencyProbes(t, reader, "failed"))
	require.Equal(t, int64(1), dependencyProbes(t, reader, "passed"))

	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld, "the probe delivery fails")
	require.Equal(t, brake.Engaged, b.State())
	awaitState(t, b, brake.Probing) // Probe passed again
	require.Equal(t, int64(failures+2), calls.Load())
	require.NoError(t, run(b, nil))
	require.Equal(t, brake.Released, b.State())
	require.False(t, b.Probing())
	require.Equal(t, int64(2), testenv.CounterWhere(t, reader, telemetry.MetricBrakeProbes, string(telemetry.AttrBrakeProbe), "delivery"))
}

// dependencyProbes counts the Probe calls with result.
func dependencyProbes(t *testing.T, reader *sdkmetric.ManualReader, result string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != telemetry.MetricBrakeProbes || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				p, _ := dp.Attributes.Value(telemetry.AttrBrakeProbe)
				r, _ := dp.Attributes.Value(telemetry.AttrBrakeProbeResult)
				if p.AsString() == "dependency" && r.AsString() == result {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// A Probe that outlasts ProbeTimeout, or panics, failed: the brake stays
// engaged and probes again.
func TestProbeTimeoutAndPanicFail(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	third := make(chan struct{})
	b, reader := newBrake(t, brake.Config{Window: 1, FailureRatio: 1, CoolDown: time.Millisecond, MaxCoolDown: time.Millisecond, Pausing: true,
		ProbeTimeout: 5 * time.Millisecond,
		Probe: func(ctx context.Context) error {
			switch calls.Add(1) {
			case 1: // outlasts ProbeTimeout
				<-ctx.Done()
				return ctx.Err()
			case 2:
				panic("driver bug")
			case 3:
				close(third)
			}
			return nil
		}})
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld)
	<-third
	awaitState(t, b, brake.Probing)
	require.Equal(t, int64(2), dependencyProbes(t, reader, "failed"))
	require.Equal(t, int64(1), dependencyProbes(t, reader, "passed"))
}

// Close cancels the Probe in progress and waits for it to return; the
// state stays as it was.
func TestCloseCancelsTheProbeInProgress(t *testing.T) {
	t.Parallel()
	blocked, returned := make(chan struct{}), make(chan struct{})
	b, _ := newBrake(t, brake.Config{Window: 1, FailureRatio: 1, CoolDown: time.Millisecond, Pausing: true,
		ProbeTimeout: time.Hour,
		Probe: func(ctx context.Context) error {
			close(blocked)
			<-ctx.Done()
			close(returned)
			return ctx.Err()
		}})
	require.ErrorIs(t, run(b, sluice.Transient(errDown)), sluice.ErrHeld)
	<-blocked
	require.NoError(t, b.Close())
	select {
	case <-returned:
	default:
		t.Fatal("Close returned before the Probe in progress")
	}
	require.NoError(t, b.Close(), "idempotent")
	require.Equal(t, brake.Engaged, b.State())
}

func TestProbeTimeoutMustBePositive(t *testing.T) {
	t.Parallel()
	_, err := brake.New(brake.Config{ProbeTimeout: -time.Second})
	require.ErrorContains(t, err, "Config.ProbeTimeout must be positive")
}
