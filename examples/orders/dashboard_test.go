package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/brake"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
)

// dashboard is what the test reads of docs/grafana/sluice.json.
type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestGrafanaDashboard checks docs/grafana/sluice.json: every panel has a
// title, a data source and queries, and every Sluice metric a query names is
// one the example exposes to Prometheus on the real services (the confirm
// latency needs RabbitMQ); RabbitMQ's own series are the plugin's.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "grafana", "sluice.json"))
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	require.Equal(t, "Sluice", d.Title)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := testenv.Name("dash")
	db := testenv.Postgres(t)
	t.Cleanup(func() { _, _ = db.Exec("DROP SCHEMA IF EXISTS " + name + " CASCADE") })
	queue := name + ".inventory"
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.100ms", queue+".retry.300ms", name+"."+rejectedTopic)
	s, err := run(ctx, config{AMQPURL: testenv.AMQPURL, PostgresURL: testenv.PostgresURL, Name: name, MetricsAddr: "unused"})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	s.metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	exposed := rec.Body.String()

	metric := regexp.MustCompile(`\b(sluice|rabbitmq)_[a-z_]+`)
	label := regexp.MustCompile(`\bsluice_(handler|outcome|class|tier|confirm)\b`)
	plugin := map[string]bool{"rabbitmq_queue_messages_ready": true, "rabbitmq_queue_consumers": true}
	// Sluice's counters, as the Prometheus exporter names them.
	var defined []string
	for _, c := range []string{retrytiers.MetricExhausted, retrytiers.MetricRetries, poison.MetricPoisoned,
		middleware.MetricRejected, middleware.MetricDeliveries, deduplication.MetricDuplicates, brake.MetricHeld, poison.MetricParked} {
		defined = append(defined, strings.ReplaceAll(c, ".", "_")+"_total")
	}
	queries := 0
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Title)
		require.NotEmpty(t, p.Datasource.UID, p.Title)
		require.NotEmpty(t, p.Targets, p.Title)
		for _, q := range p.Targets {
			queries++
			names := metric.FindAllString(label.ReplaceAllString(q.Expr, ""), -1)
			require.NotEmpty(t, names, "%s: a query without a metric", p.Title)
			for _, m := range names {
				if plugin[m] {
					continue
				}
				if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(m) + `[{ ]`).MatchString(exposed) {
					// Not in this run's output: a counter appears once added
					// to. It must still be one Sluice defines.
					require.Contains(t, defined, m, "%s queries %s, which Sluice does not define", p.Title, m)
				}
			}
		}
	}
	require.GreaterOrEqual(t, queries, 9)
}
