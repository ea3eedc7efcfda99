package main

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRules checks docs/alerts.yml: every rule is complete, links to a
// section of the runbook that exists, and every metric and label its
// expression and annotations use is one the example actually exposes to
// Prometheus (requireExposed).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "alerts.yml"))
	require.NoError(t, err)
	var rf ruleFile
	require.NoError(t, yaml.Unmarshal(b, &rf))
	runbook, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := run(ctx, config{DBPath: filepath.Join(t.TempDir(), "orders.db"), MetricsAddr: "unused"})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	s.metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	exposed := rec.Body.String()

	rules := 0
	needs := map[string][]string{} // alert → what its rules need
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			rules++
			require.Contains(t, []string{"sluice_metrics", "sluice_depth_gauges", "rabbitmq_prometheus"}, r.Labels["needs"],
				"%s says what it needs in its label needs", r.Alert)
			needs[r.Alert] = append(needs[r.Alert], r.Labels["needs"])
			require.NotEmpty(t, r.Alert)
			require.NotEmpty(t, r.Expr, r.Alert)
			require.NotEmpty(t, r.For, r.Alert)
			require.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
			link := r.Annotations["runbook_url"]
			const runbookURL = "https://github.com/sluicemq/sluice/blob/main/docs/operations.md#"
			require.True(t, strings.HasPrefix(link, runbookURL), "%s: runbook_url must be absolute (an alert is read in a pager, not in this repository): %s", r.Alert, link)
			heading := strings.ReplaceAll(strings.TrimPrefix(link, runbookURL), "-", " ")
			require.Regexp(t, `(?im)^## `+regexp.QuoteMeta(heading)+`$`, string(runbook), "%s links to a runbook section that does not exist", r.Alert)
			requireExposed(t, r.Alert, r.Expr, exposed, r.Annotations["summary"], r.Annotations["description"])
		}
	}
	require.Equal(t, 16, rules)
	for alert, n := range needs { // what the plugin gives, Sluice's depth gauges give too
		if slices.Contains(n, "rabbitmq_prometheus") {
			require.Contains(t, n, "sluice_depth_gauges", "%s works only with the broker's plugin", alert)
		}
	}
}

// promtool checks docs/alerts.yml and runs its unit tests,
// docs/alerts_test.yml: among them, a queue of another application on the
// broker ("reports", no poison queue beside it) fires none of the main-queue
// alerts. Before, their regex matched every queue not named like a tier or a
// poison queue, and "reports" fired SluiceMainBacklogGrowing and
// SluiceNoConsumers. make test installs promtool (scripts/services.sh).
func TestAlertRulesUnderPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is needed: make services installs it (Debian's prometheus package)")
	docs := filepath.Join("..", "..", "docs")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = docs
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %v:\n%s", args, out)
	}
}
