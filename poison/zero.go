package poison

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice/internal/telemetry"
)

// poisonedCounter is sluice.poisoned, as New and ExportAtZero create it.
func poisonedCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	return telemetry.Meter(mp).Int64Counter(telemetry.MetricPoisoned, metric.WithDescription("Messages isolated in the poison queue."))
}

// ExportAtZero exports the stage's sluice.poisoned at zero for the
// deliveries of one handler, one series per class in cfg.Classes, before
// its first poisoning: a rate over a series that appears at its first
// increment misses that increment, and the alert on it
// (SluicePoisonRateRising, docs/alerts.yml) would not fire for the first
// poisoning. handler is the name the metrics carry
// (messaging.consumer.group.name: the name given to router.Add), queue the
// queue the handler consumes, system the messaging system ("rabbitmq"; ""
// leaves it out). router.Add calls it; call it once per handler when you
// add the stage by hand. Only cfg.MeterProvider and cfg.Classes are read.
func ExportAtZero(cfg Config, handler, queue, system string) error {
	cfg = cfg.withDefaults()
	poisoned, err := poisonedCounter(cfg.MeterProvider)
	if err != nil {
		return err
	}
	for _, class := range cfg.Classes {
		poisoned.Add(context.Background(), 0, metric.WithAttributes(
			telemetry.HandlerAttrs(handler, queue, system, semconv.ErrorTypeKey.String(class.String()))...))
	}
	return nil
}
