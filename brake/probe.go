package brake

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// The values of sluice.brake.probe and sluice.brake.probe.result.
const (
	probeDependency    = "dependency"
	probeDelivery      = "delivery"
	resultPassed       = "passed"
	resultFailed       = "failed"
	resultInconclusive = "inconclusive"
)

// startCoolDown arms the cool-down (b.mu held): when it ends, endCoolDown
// probes. A closed brake arms nothing.
func (b *Brake) startCoolDown() {
	if b.closed() {
		return
	}
	b.timer = b.cfg.Clock.AfterFunc(b.coolDown, b.endCoolDown)
}

// endCoolDown ends a cool-down. Without Config.Probe the brake probes with
// a delivery at once. With one, it calls Probe first, still engaged — the
// subscriber takes nothing meanwhile — and lets a delivery probe only once
// Probe passes; a failed Probe starts another, doubled cool-down.
func (b *Brake) endCoolDown() {
	b.mu.Lock()
	if b.closed() || b.state != Engaged {
		b.mu.Unlock()
		return
	}
	if b.cfg.Probe == nil {
		b.transition(Probing, nil)
		b.mu.Unlock()
		return
	}
	b.running.Add(1) // under b.mu while open: Close's Wait sees it
	b.mu.Unlock()
	defer b.running.Done()

	err := b.callProbe()

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed() || b.state != Engaged {
		return
	}
	if err != nil {
		b.failedProbes++
		b.countProbe(probeDependency, resultFailed)
		b.coolDown = min(2*b.coolDown, b.cfg.MaxCoolDown)
		b.cfg.Logger.Info("Brake probe failed: consuming stays stopped for another cool-down", watermill.LogFields{
			"handler": b.cfg.Name, "error": diag.RedactError(err).Error(),
			"failed_probes": b.failedProbes, "cool_down": b.coolDown.String(),
		})
		b.startCoolDown()
		return
	}
	b.countProbe(probeDependency, resultPassed)
	b.transition(Probing, nil)
}

// callProbe calls Config.Probe bounded by ProbeTimeout; a panic is a failed
// probe, not a crash of the timer's goroutine.
func (b *Brake) callProbe() (err error) {
	ctx, cancel := context.WithTimeout(b.probeCtx, b.cfg.ProbeTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("brake: the probe panicked: %v", p)
		}
	}()
	return b.cfg.Probe(ctx)
}

// closed reports whether Close has been called: it cancels probeCtx.
func (b *Brake) closed() bool { return b.probeCtx.Err() != nil }

func (b *Brake) countProbe(probe, result string) {
	b.probeCt.Add(context.Background(), 1, metric.WithAttributes(
		telemetry.HandlerKey.String(b.cfg.Name), telemetry.AttrBrakeProbe.String(probe), telemetry.AttrBrakeProbeResult.String(result)))
}

// Close stops the cool-down and the probes: a Probe call in progress has
// its context cancelled, and Close waits for it to return. The state stays
// as it was (an engaged brake holds deliveries until their context ends).
// Idempotent; router.Add calls it when the handler's subscriber closes.
func (b *Brake) Close() error {
	b.mu.Lock()
	if b.timer != nil {
		b.timer.Stop()
	}
	b.cancelProbes()
	b.mu.Unlock()
	b.running.Wait()
	return nil
}
