package retrytiers

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// counters are sluice.retries and sluice.exhausted, as New and ExportAtZero
// create them.
func counters(mp metric.MeterProvider) (retries, exhausted metric.Int64Counter, err error) {
	meter := telemetry.Meter(mp)
	if retries, err = meter.Int64Counter(telemetry.MetricRetries, metric.WithDescription("Copies published to a retry tier.")); err != nil {
		return nil, nil, err
	}
	exhausted, err = meter.Int64Counter(telemetry.MetricExhausted, metric.WithDescription("Transient failures whose retry budget was spent."))
	return retries, exhausted, err
}

// ExportAtZero exports the stage's counters at zero for the deliveries of
// one handler, before its first retry: sluice.retries for each tier of
// cfg.Tiers, and sluice.exhausted. A rate over a series that appears at its
// first increment misses that increment. handler is the name the metrics
// carry (messaging.consumer.group.name: the name given to router.Add),
// queue the queue the handler consumes, system the messaging system
// ("rabbitmq"; "" leaves it out). router.Add calls it; call it once per
// handler when you add the stage by hand. Only cfg.MeterProvider and
// cfg.Tiers are read.
func ExportAtZero(cfg Config, handler, queue, system string) error {
	retries, exhausted, err := counters(cfg.MeterProvider)
	if err != nil {
		return err
	}
	transient := semconv.ErrorTypeKey.String(sluice.ClassTransient.String())
	for _, t := range cfg.Tiers {
		retries.Add(context.Background(), 0, metric.WithAttributes(
			telemetry.HandlerAttrs(handler, queue, system, telemetry.AttrTier.String(t.Name), transient)...))
	}
	exhausted.Add(context.Background(), 0, metric.WithAttributes(
		telemetry.HandlerAttrs(handler, queue, system, semconv.ErrorTypeKey.String(sluice.ClassExhausted.String()))...))
	return nil
}
