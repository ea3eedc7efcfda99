package rabbitmq

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice/internal/telemetry"
)

// system is messaging.system of the publisher's metrics.
var system = semconv.MessagingSystemRabbitMQ

// publisherMetrics are the Publisher's instruments, from one provider.
type publisherMetrics struct {
	confirm    metric.Float64Histogram
	reconnects metric.Int64Counter
}

func newPublisherMetrics(mp metric.MeterProvider) (*publisherMetrics, error) {
	meter := telemetry.Meter(mp)
	h, err := meter.Float64Histogram(telemetry.MetricPublishConfirmDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from publishing a message to its publisher confirm."),
		metric.WithExplicitBucketBoundaries(telemetry.DurationBuckets...))
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: creating %s: %w", telemetry.MetricPublishConfirmDuration, err)
	}
	rc, err := meter.Int64Counter(telemetry.MetricPublishReconnects,
		metric.WithDescription("The confirmed publisher reopening its channel or connection after it closed."))
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: creating %s: %w", telemetry.MetricPublishReconnects, err)
	}
	return &publisherMetrics{confirm: h, reconnects: rc}, nil
}

// meters holds the instruments a Publisher records with: those of its
// Connection.MeterProvider, or — when that is unset — of the first provider
// router.Add hands its Broker (adopt), else the global provider's.
type meters struct {
	current atomic.Pointer[publisherMetrics]
	own     bool // Connection.MeterProvider was set: adopt does nothing

	mu      sync.Mutex
	adopted bool
}

func (m *meters) confirmed(ctx context.Context, seconds float64, dest, outcome string) {
	m.current.Load().confirm.Record(ctx, seconds, metric.WithAttributes(system,
		semconv.MessagingDestinationName(dest), telemetry.AttrConfirm.String(outcome)))
}

func (m *meters) reconnected(scope string) {
	m.current.Load().reconnects.Add(context.Background(), 1, metric.WithAttributes(system, telemetry.AttrReconnect.String(scope)))
}

// adopt records with mp's instruments from now on, unless the publisher has
// a provider of its own or adopted one before; a nil mp is ignored.
func (m *meters) adopt(mp metric.MeterProvider) error {
	if mp == nil || m.own {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.adopted {
		return nil
	}
	pm, err := newPublisherMetrics(mp)
	if err != nil {
		return err
	}
	m.current.Store(pm)
	m.adopted = true
	return nil
}
