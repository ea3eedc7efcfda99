package testenv

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// metrics collects reader and returns the instruments named name.
func metrics(t testing.TB, reader *sdkmetric.ManualReader, name string) []metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var out []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				out = append(out, m)
			}
		}
	}
	return out
}

// counterPoints collects reader and returns the data points of the int64
// counter name (none when it was never added to).
func counterPoints(t testing.TB, reader *sdkmetric.ManualReader, name string) []metricdata.DataPoint[int64] {
	t.Helper()
	var points []metricdata.DataPoint[int64]
	for _, m := range metrics(t, reader, name) {
		sum, ok := m.Data.(metricdata.Sum[int64])
		require.True(t, ok, "%s is not an int64 sum", name)
		points = append(points, sum.DataPoints...)
	}
	return points
}

// CounterSum collects reader and returns the sum of the int64 counter name
// over all its attribute sets (0 when it was never added to).
func CounterSum(t testing.TB, reader *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var total int64
	for _, dp := range counterPoints(t, reader, name) {
		total += dp.Value
	}
	return total
}

// AttributeValues collects reader and returns the sorted distinct values of
// the attribute key on the int64 counter name's data points that were
// added to (not those exported at zero before any event).
func AttributeValues(t testing.TB, reader *sdkmetric.ManualReader, name, key string) []string {
	t.Helper()
	var out []string
	for _, dp := range counterPoints(t, reader, name) {
		if v, ok := dp.Attributes.Value(attribute.Key(key)); ok && dp.Value != 0 && !slices.Contains(out, v.String()) {
			out = append(out, v.String())
		}
	}
	slices.Sort(out)
	return out
}

// CounterWhere collects reader and returns the sum of the int64 counter
// name over the data points whose attribute key is value.
func CounterWhere(t testing.TB, reader *sdkmetric.ManualReader, name, key, value string) int64 {
	t.Helper()
	var total int64
	for _, dp := range counterPoints(t, reader, name) {
		if v, ok := dp.Attributes.Value(attribute.Key(key)); ok && v.String() == value {
			total += dp.Value
		}
	}
	return total
}

// Histogram collects reader and returns how many values the int64
// histogram name recorded and the largest, over all its attribute sets
// (0, 0 when none).
func Histogram(t testing.TB, reader *sdkmetric.ManualReader, name string) (count uint64, largest int64) {
	t.Helper()
	for _, m := range metrics(t, reader, name) {
		h, ok := m.Data.(metricdata.Histogram[int64])
		require.True(t, ok, "%s is not an int64 histogram", name)
		for _, p := range h.DataPoints {
			count += p.Count
			if v, ok := p.Max.Value(); ok {
				largest = max(largest, v)
			}
		}
	}
	return count, largest
}

// HistogramMax is Histogram's largest value.
func HistogramMax(t testing.TB, reader *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	_, largest := Histogram(t, reader, name)
	return largest
}
