package router

import (
	"cmp"
	"errors"

	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/stage"
)

// exportAtZero exports, for the handler named handler consuming topic on
// system, every counter of its stages that a shipped alert or the runbook
// reads (docs/alerts.yml, docs/operations.md: poisonings, failed
// deliveries, retries, exhaustions, duplicates) at zero, before its first
// delivery: a rate over a series that appears at its first increment
// misses that increment, so the first poisoning's alert would not fire.
// Add calls it once per handler.
func exportAtZero(s Stages, handler, topic, system string) error {
	mp := func(own metric.MeterProvider) metric.MeterProvider { return cmp.Or(own, s.MeterProvider) }
	var errs []error
	if t := s.Trace; t != nil {
		errs = append(errs, stage.ExportTraceAtZero(stage.TraceConfig{Env: sluice.Env{MeterProvider: mp(t.MeterProvider)}, System: t.System}, handler, topic, system))
	}
	if p := s.Poison; p != nil {
		errs = append(errs, poison.ExportAtZero(poison.Config{Env: sluice.Env{MeterProvider: mp(p.MeterProvider)}, Classes: p.Classes}, handler, topic, system))
	}
	if r := s.Retry; r != nil {
		errs = append(errs, retrytiers.ExportAtZero(retrytiers.Config{Env: sluice.Env{MeterProvider: mp(r.MeterProvider)}, Tiers: r.Tiers}, handler, topic, system))
	}
	if in := s.Inbox; in != nil {
		errs = append(errs, deduplication.ExportDuplicatesAtZero(deduplication.Config{Env: sluice.Env{MeterProvider: mp(in.MeterProvider)}}, handler, topic, system))
	}
	return errors.Join(errs...)
}
