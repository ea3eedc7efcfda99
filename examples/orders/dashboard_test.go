package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
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
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// TestGrafanaDashboard checks docs/grafana/sluice.json: every panel has a
// title, a data source and queries, and every metric and label a query, a
// legend or a variable names is one the example exposes to Prometheus on
// the real services (the confirm latency needs RabbitMQ; requireExposed);
// RabbitMQ's own series are the plugin's.
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
	testenv.DeleteQueuesAtEnd(t, exampleQueues(name)...)
	s, err := run(ctx, config{AMQPURL: testenv.AMQPURL, PostgresURL: testenv.PostgresURL, Name: name, MetricsAddr: "unused"})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	s.metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	exposed := rec.Body.String()

	queries := 0
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Title)
		require.NotEmpty(t, p.Datasource.UID, p.Title)
		require.NotEmpty(t, p.Targets, p.Title)
		for _, q := range p.Targets {
			queries++
			requireExposed(t, p.Title, q.Expr, exposed, q.LegendFormat)
		}
	}
	require.GreaterOrEqual(t, queries, 9)
	variables := 0
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		variables++
		inner, ok := strings.CutPrefix(v.Query, "label_values(")
		require.True(t, ok, "variable %s: a label_values query", v.Name)
		i := strings.LastIndex(inner, ",")
		requireExposed(t, "variable "+v.Name, inner[:i]+" by ("+strings.TrimSuffix(strings.TrimSpace(inner[i+1:]), ")")+")", exposed)
	}
	require.Equal(t, 2, variables, "$handler and $queue")
}
