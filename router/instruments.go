package router

import (
	"cmp"
	"errors"

	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
)

// exportAtZero exports, for the handler named handler consuming topic on
// system, every counter of its stages that a shipped alert reads
// (docs/alerts.yml) at zero, before its first delivery: a rate over a
// series that appears at its first increment misses that increment, so the
// first poisoning's alert would not fire. Add calls it once per handler.
func exportAtZero(s Stages, handler, topic, system string) error {
	var errs []error
	if s.Trace != nil {
		cfg := *s.Trace
		cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
		errs = append(errs, middleware.ExportTraceAtZero(cfg, handler, topic, system))
	}
	if s.Poison != nil {
		cfg := *s.Poison
		cfg.MeterProvider = cmp.Or(cfg.MeterProvider, s.MeterProvider)
		errs = append(errs, poison.ExportAtZero(cfg, handler, topic, system))
	}
	return errors.Join(errs...)
}
