package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]|\boffset\s+[0-9a-z]+|\b[0-9][0-9.e+-]*\b`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promSelector = regexp.MustCompile(`\{[^}]*\}`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promTemplate = regexp.MustCompile(`\{\{\s*(?:\$labels\.)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "and", "or", "unless", "bool"}
)

// promNames returns the metric names and the label names a PromQL
// expression uses: the labels of its groupings and matchers, the metrics
// every other name that is not a function or a keyword.
func promNames(expr string) (metrics, labels []string) {
	e := promRange.ReplaceAllString(promString.ReplaceAllString(expr, `""`), "")
	for _, g := range promGrouping.FindAllStringSubmatch(e, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	e = promGrouping.ReplaceAllString(e, " ")
	for _, sel := range promSelector.FindAllString(e, -1) {
		for _, m := range promMatcher.FindAllStringSubmatch(sel, -1) {
			labels = append(labels, m[1])
		}
	}
	e = promSelector.ReplaceAllString(e, " ")
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		if slices.Contains(promKeywords, name) || strings.HasPrefix(strings.TrimSpace(e[loc[1]:]), "(") ||
			(loc[0] > 0 && e[loc[0]-1] == '$') { // a function, a keyword, a Grafana variable
			continue
		}
		metrics = append(metrics, name)
	}
	return metrics, labels
}

// templateLabels returns the labels a legend or an annotation names
// ({{label}}, {{ $labels.label }}).
func templateLabels(s string) []string {
	var out []string
	for _, m := range promTemplate.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// definedCounters are Sluice's counters a run of the example may never add
// to, as the Prometheus exporter names them.
func definedCounters() []string {
	var out []string
	for _, c := range []string{"sluice.exhausted", "sluice.retries", "sluice.poisoned",
		"sluice.rejected", "messaging.client.consumed.messages", "sluice.inbox.duplicates", "sluice.brake.held", "sluice.poison.parked",
		"sluice.outbox.failures"} {
		out = append(out, strings.ReplaceAll(c, ".", "_")+"_total")
	}
	return out
}

// relayGauges are the outbox relay's gauges, as the Prometheus exporter
// names them: observed only while a relay runs, and the example's has
// stopped when its metrics are read.
var relayGauges = []string{
	"sluice_outbox_pending",
	"sluice_outbox_failing",
	"sluice_outbox_dead",
	"sluice_outbox_oldest_age_seconds",
}

// orderGauges are the ordering stage's gauges (router.Stages.Order), which
// the example does not use.
var orderGauges = []string{
	"sluice_order_keys",
	"sluice_order_waiting",
	"sluice_order_oldest_age_seconds",
}

// depthGauges are rabbitmq.Broker's depth gauges, as the Prometheus
// exporter names them: observed while a Broker reads its queues, which the
// example on the embedded default has none of.
var depthGauges = []string{
	"sluice_queue_messages_ready",
	"sluice_queue_consumers",
}

// pluginSeries are the series and labels of RabbitMQ's rabbitmq_prometheus
// plugin the rules and the dashboard use.
var (
	pluginSeries = []string{"rabbitmq_queue_messages_ready", "rabbitmq_queue_consumers"}
	pluginLabels = []string{"queue", "vhost"}
)

// requireExposed checks that every metric expr uses is one the example
// exposes (or one Sluice defines, for a counter this run never added to, or
// the plugin's), and every label expr and the templates use is on one of
// its metrics as exposed (or the plugin's, when expr reads the plugin's).
func requireExposed(t *testing.T, where, expr, exposed string, templates ...string) {
	t.Helper()
	metrics, labels := promNames(expr)
	require.NotEmpty(t, metrics, "%s: a query without a metric: %s", where, expr)
	var lines []string // the exposed series of expr's metrics
	plugin := false
	for _, m := range metrics {
		if slices.Contains(pluginSeries, m) {
			plugin = true
			continue
		}
		found := regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(m)+`(?:_bucket|_sum|_count)?[{ ].*$`).FindAllString(exposed, -1)
		if len(found) == 0 && !slices.Contains(relayGauges, m) && !slices.Contains(depthGauges, m) && !slices.Contains(orderGauges, m) {
			require.Contains(t, definedCounters(), m, "%s uses %s, which Sluice does not expose", where, m)
		}
		lines = append(lines, found...)
	}
	for _, tmpl := range templates {
		for _, l := range templateLabels(tmpl) {
			require.Contains(t, labels, l, "%s: %q names %s, which the query does not keep", where, tmpl, l)
		}
	}
	if len(lines) == 0 {
		return // only counters this run never added to, or the plugin's
	}
	for _, l := range labels {
		if l == "le" || (plugin && slices.Contains(pluginLabels, l)) {
			continue
		}
		on := false
		for _, line := range lines {
			if strings.Contains(line, "{"+l+`="`) || strings.Contains(line, ","+l+`="`) {
				on = true
				break
			}
		}
		require.True(t, on, "%s uses the label %s, which none of %v carries as exposed", where, l, metrics)
	}
}

func TestPromNames(t *testing.T) {
	t.Parallel()
	m, l := promNames(`histogram_quantile(0.99, sum by (le, a_b) (rate(x_bucket{c=~"$h", d!="v{x}"}[$__rate_interval]))) > 3 * max by (q) (deriv(y[15m] offset 5m)) and on (vhost) z`)
	require.Equal(t, []string{"x_bucket", "y", "z"}, m)
	require.Equal(t, []string{"le", "a_b", "q", "vhost", "c", "d"}, l)
	require.Equal(t, []string{"a", "b"}, templateLabels(`{{a}} p99 {{ $labels.b }}`))
}
