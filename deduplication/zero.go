package deduplication

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice/internal/telemetry"
)

// duplicatesCounter is sluice.inbox.duplicates, as New and ExportDuplicatesAtZero create it.
func duplicatesCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	dup, err := telemetry.Meter(mp).Int64Counter(telemetry.MetricInboxDuplicates,
		metric.WithDescription("Deliveries skipped because their key was already processed."))
	if err != nil {
		return nil, fmt.Errorf("deduplication: creating %s counter: %w", telemetry.MetricInboxDuplicates, err)
	}
	return dup, nil
}

// ExportDuplicatesAtZero exports the stage's sluice.inbox.duplicates at zero for the
// deliveries of one handler, before its first duplicate: a rate over a
// series that appears at its first increment misses that increment.
// handler is the name the metrics carry (messaging.consumer.group.name:
// the name given to router.Add), queue the queue the handler consumes,
// system the messaging system ("rabbitmq"; "" leaves it out). router.Add
// calls it; call it once per handler when you add the stage by hand. Only
// cfg.MeterProvider is read.
func ExportDuplicatesAtZero(cfg Config, handler, queue, system string) error {
	dup, err := duplicatesCounter(cfg.MeterProvider)
	if err != nil {
		return err
	}
	dup.Add(context.Background(), 0, metric.WithAttributes(telemetry.HandlerAttrs(handler, queue, system)...))
	return nil
}
