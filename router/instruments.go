package router

import (
	"cmp"
	"errors"

	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice/internal/poisonqueue"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// ExportCountersAtZero exports, for the handler named handler consuming
// queue on system (the messaging system, "rabbitmq"; "" leaves it out),
// every counter of s's stages that a shipped alert or the runbook reads
// (docs/alerts.yml, docs/operations.md) at zero, before its first
// delivery: sluice.poisoned for each class the Poison stage isolates,
// messaging.client.consumed.messages of failed deliveries for each class
// and none (Trace), sluice.retries for each tier and sluice.exhausted
// (Retry), sluice.inbox.duplicates (Inbox). A rate over a series that
// appears at its first increment misses that increment, so the first
// poisoning's alert would not fire. Only the stages' MeterProvider (theirs,
// else s.MeterProvider), Poison's Classes, Retry's Tiers and Trace's System
// are read. Add calls it once per handler; call it once per handler when
// you add the stages by hand, with the configs you built them from.
func ExportCountersAtZero(handler, queue, system string, s Stages) error {
	mp := func(own metric.MeterProvider) metric.MeterProvider { return cmp.Or(own, s.MeterProvider) }
	var errs []error
	if t := s.Trace; t != nil {
		errs = append(errs, telemetry.ZeroConsumed(mp(t.MeterProvider), handler, queue, cmp.Or(t.System, system)))
	}
	if p := s.Poison; p != nil {
		classes := p.Classes
		if len(classes) == 0 {
			classes = poisonqueue.ClassesDefault
		}
		errs = append(errs, telemetry.ZeroPoisoned(mp(p.MeterProvider), classes, handler, queue, system))
	}
	if r := s.Retry; r != nil {
		tiers := make([]string, len(r.Tiers))
		for i, t := range r.Tiers {
			tiers[i] = t.Name
		}
		errs = append(errs, telemetry.ZeroRetries(mp(r.MeterProvider), tiers, handler, queue, system))
	}
	if in := s.Inbox; in != nil {
		errs = append(errs, telemetry.ZeroDuplicates(mp(in.MeterProvider), handler, queue, system))
	}
	return errors.Join(errs...)
}
