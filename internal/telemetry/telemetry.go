// Package telemetry holds the OpenTelemetry names and helpers the stages
// share, so that every stage reports under one instrumentation scope.
package telemetry

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of every Sluice meter and tracer.
const ScopeName = "github.com/sluicemq/sluice"

// HandlerKey is the attribute naming the Watermill handler of a delivery.
const HandlerKey = attribute.Key("sluice.handler")

// Meter returns Sluice's meter from mp, or from the global provider when mp
// is nil.
func Meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(ScopeName)
}

// HandlerAttr returns the handler attribute of a delivery as a measurement
// option ("" when the message is not handled by a Watermill router).
func HandlerAttr(msg *message.Message) metric.MeasurementOption {
	return metric.WithAttributes(HandlerKey.String(message.HandlerNameFromCtx(msg.Context())))
}
