// Package promexport serves Sluice's metrics to Prometheus in one option:
// New returns an OpenTelemetry MeterProvider (the Prometheus exporter's)
// that is also the /metrics handler.
//
//	metrics, err := promexport.New(promexport.Config{})
//	svc, err := service.New(service.Config{..., Env: sluice.Env{MeterProvider: metrics}})
//	mux.Handle("/metrics", metrics)
//
// It is the one package of the module that links the Prometheus client and
// OpenTelemetry's exporter: a service that does not import it links
// neither. Metric names and their Prometheus forms: docs/observability.md.
package promexport
