package outbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/sluicemq/sluice/internal/telemetry"
)

// The error.type values of sluice.outbox.failures for a row whose publish failed
// (errorType); "store" is the relay's own reads and writes, with no
// destination.
const (
	errorTypeRefused       = "refused"
	errorTypeUnreachable   = "unreachable"
	errorTypeUncertain     = "uncertain"
	errorTypeUnpublishable = "unpublishable"
	errorTypeUnreadable    = "unreadable"
)

// publishErrorTypes are errorType's values, each exported at zero.
var publishErrorTypes = []string{errorTypeRefused, errorTypeUnreachable, errorTypeUncertain, errorTypeUnpublishable, errorTypeUnreadable}

// ExportCountersAtZero exports the relay's sluice.outbox.relayed and sluice.outbox.failures (each
// error.type a row's publish may fail with) at zero for destination, a
// topic its rows go to, before the first row to it: a rate over a series
// that appears at its first increment misses that increment, so
// SluiceOutboxFailing (docs/alerts.yml) would not see the first failure.
// service.Service.Add calls it for each handler's PublishTopic; call it for
// each destination when you run a relay of your own.
func (r *Relay) ExportCountersAtZero(destination string) {
	ctx := context.Background()
	r.relayed.Add(ctx, 0, metric.WithAttributeSet(attribute.NewSet(telemetry.AttrOutbox.String(r.cfg.name), semconv.MessagingDestinationName(destination))))
	for _, kind := range publishErrorTypes {
		r.failures.Add(ctx, 0, metric.WithAttributeSet(attribute.NewSet(telemetry.AttrOutbox.String(r.cfg.name),
			semconv.MessagingDestinationName(destination), semconv.ErrorTypeKey.String(kind))))
	}
}
