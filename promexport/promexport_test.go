package promexport_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/promexport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	return rec.Body.String()
}

// What is counted on the exporter's MeterProvider is served in Prometheus's
// format, with Go's and the process's collectors beside it; with a registry
// of yours, beside your own metrics.
func TestTheMeterProviderIsServed(t *testing.T) {
	t.Parallel()
	e, err := promexport.New(promexport.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Shutdown(t.Context())) })
	c, err := e.Meter("test").Int64Counter("sluice.test.counted")
	require.NoError(t, err)
	c.Add(t.Context(), 3)
	body := scrape(t, e)
	require.Regexp(t, `sluice_test_counted_total\{[^}]*\} 3\n`, body)
	require.Contains(t, body, "go_goroutines ")

	// A reader of yours reads the same counts.
	manual := sdkmetric.NewManualReader()
	withReader, err := promexport.New(promexport.Config{Readers: []sdkmetric.Reader{manual}})
	require.NoError(t, err)
	c, err = withReader.Meter("test").Int64Counter("sluice.test.counted")
	require.NoError(t, err)
	c.Add(t.Context(), 2)
	var rm metricdata.ResourceMetrics
	require.NoError(t, manual.Collect(t.Context(), &rm))
	require.Equal(t, int64(2), rm.ScopeMetrics[0].Metrics[0].Data.(metricdata.Sum[int64]).DataPoints[0].Value)
	require.Regexp(t, `sluice_test_counted_total\{[^}]*\} 2\n`, scrape(t, withReader))
	require.NoError(t, withReader.Shutdown(t.Context()))

	reg := prometheus.NewRegistry()
	mine := prometheus.NewCounter(prometheus.CounterOpts{Name: "mine_total"})
	reg.MustRegister(mine)
	mine.Inc()
	yours, err := promexport.New(promexport.Config{Registry: reg})
	require.NoError(t, err)
	c, err = yours.Meter("test").Int64Counter("sluice.test.counted")
	require.NoError(t, err)
	c.Add(t.Context(), 1)
	body = scrape(t, yours)
	require.Contains(t, body, "mine_total 1\n")
	require.Regexp(t, `sluice_test_counted_total\{[^}]*\} 1\n`, body)
	require.NotContains(t, body, "go_goroutines ", "your registry as you built it")
	require.NoError(t, yours.Shutdown(t.Context()))
}
