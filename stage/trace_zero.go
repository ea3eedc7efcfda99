package stage

import (
	"cmp"
	"context"
	"fmt"

	"go.opentelemetry.io/otel/semconv/v1.37.0/messagingconv"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// ExportTraceAtZero exports the Trace stage's messaging.client.consumed.messages at zero for
// the deliveries of one handler before its first delivery: the series of
// a failed delivery (sluice.outcome "failed": a failure that reached the
// router and was nacked), one per class it may carry and one without. A
// rate over a series that appears at its first increment misses that
// increment, and the alert on it (SluiceDeliveriesNacked,
// docs/alerts.yml) would not see the first failure. handler is the name the
// metrics carry (messaging.consumer.group.name: the name given to
// router.Add), queue the queue it consumes, system the messaging system
// when cfg.System is unset ("" leaves it out). router.Add calls it; call it
// once per handler when you add the stage by hand. Only cfg.MeterProvider
// and cfg.System are read.
func ExportTraceAtZero(cfg TraceConfig, handler, queue, system string) error {
	consumed, err := messagingconv.NewClientConsumedMessages(telemetry.Meter(cfg.MeterProvider))
	if err != nil {
		return fmt.Errorf("middleware: creating %s: %w", telemetry.MetricConsumed, err)
	}
	k := metricKey{handler: handler, dest: queue, system: cmp.Or(cfg.System, system), outcome: sluice.OutcomeFailed}
	consumed.AddSet(context.Background(), 0, k.attrs()) // a failure of no class
	for c := sluice.ClassTransient; c.Valid(); c++ {
		k.class, k.errorType = c.String(), c.String()
		consumed.AddSet(context.Background(), 0, k.attrs())
	}
	return nil
}
