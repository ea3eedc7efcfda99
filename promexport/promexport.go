package promexport

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Config configures New.
type Config struct {
	// Registry is where the metrics are registered and served from: yours,
	// to serve Sluice's beside your own. Default a registry of the
	// exporter's own, with Go's and the process's collectors.
	Registry *prometheus.Registry
	// Readers read the same instruments beside the exporter: a periodic
	// reader of an OTLP exporter, a ManualReader a program reads its own
	// counts from. Default none.
	Readers []sdkmetric.Reader
}

// Exporter is an OpenTelemetry MeterProvider whose metrics Prometheus
// scrapes: give it where a MeterProvider goes (service.Config.Env.MeterProvider,
// router.Stages.Env.MeterProvider) and serve it (it is the /metrics handler).
// Safe for concurrent use.
type Exporter struct {
	*sdkmetric.MeterProvider
	handler http.Handler
}

// New returns an Exporter: OpenTelemetry's Prometheus exporter reading a
// new MeterProvider, its metrics served from cfg.Registry.
func New(cfg Config) (*Exporter, error) {
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		if err := reg.Register(collectors.NewGoCollector()); err != nil {
			return nil, fmt.Errorf("promexport: registering Go's collector: %w", err)
		}
		if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return nil, fmt.Errorf("promexport: registering the process's collector: %w", err)
		}
	}
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("promexport: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exporter)}
	for _, r := range cfg.Readers {
		opts = append(opts, sdkmetric.WithReader(r))
	}
	return &Exporter{
		MeterProvider: sdkmetric.NewMeterProvider(opts...),
		handler:       promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}, nil
}

// ServeHTTP serves the metrics in Prometheus's exposition format.
func (e *Exporter) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.handler.ServeHTTP(w, r) }
