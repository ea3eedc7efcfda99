package service_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/promexport"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/service"
)

// series returns the values of the series of name in a Prometheus text
// exposition whose labels include every one of labels.
func series(exposition, name string, labels ...string) []string {
	var out []string
	for _, line := range strings.Split(exposition, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(set, l)
		}
		if all {
			out = append(out, value)
		}
	}
	return out
}

// The short path's /metrics, scraped once the router runs and before any
// message, has every counter an alert or the runbook reads at 0 — the
// outbox relay's relayed and failures for the handler's destination, the
// inbox's duplicates, the retries of each tier — and the main queue's
// consumer counted — on RabbitMQ and PostgreSQL. Before, those counters
// appeared at their first increment (a rate() over them missed it:
// SluiceOutboxFailing did not see the first failure), and
// sluice_queue_consumers read 0 for the main queue until the broker's next
// depth read (here an hour away).
func TestTheShortPathsCountersAreThereBeforeAnyTraffic(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	queue, produced := testenv.Name("zero"), testenv.Name("zero_produced")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection:    rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:      rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{time.Second, 2 * time.Second}},
		DepthInterval: time.Hour,
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".retry.1s", queue+".retry.2s", queue+".poison")
	t.Cleanup(func() { _ = q.Close() })
	metrics, err := promexport.New(promexport.Config{})
	require.NoError(t, err)
	r := newRouter(t, testenv.NewLog())
	svc := newService(t, service.Config{DB: db, Schema: testenv.Schema(t, db), Router: r, Publisher: q.Publisher(), Env: sluice.Env{MeterProvider: metrics}})
	require.NoError(t, svc.Add(service.Handler{Broker: q, Name: "zero", PublishTopic: produced, PublishingHandler: produceOne}))
	run(t, r, svc)
	scrape := func() string {
		rec := httptest.NewRecorder()
		metrics.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Body.String()
	}

	handler, dest := `messaging_consumer_group_name="zero"`, `messaging_destination_name="`+produced+`"`
	require.Eventually(t, func() bool {
		return strings.Join(series(scrape(), "sluice_queue_consumers", `sluice_queue_role="main"`, `messaging_destination_name="`+queue+`"`), ",") == "1"
	}, 2*time.Minute, 10*time.Millisecond, "the main queue's consumer is counted once it consumes, not at the next depth read")
	m := scrape()
	for name, labels := range map[string][][]string{
		"sluice_outbox_relayed_total": {{dest}},
		"sluice_outbox_failures_total": {{dest, `error_type="refused"`}, {dest, `error_type="unreachable"`}, {dest, `error_type="uncertain"`},
			{dest, `error_type="unpublishable"`}, {dest, `error_type="unreadable"`}, {`error_type="store"`}},
		"sluice_inbox_duplicates_total": {{handler}},
		"sluice_retries_total":          {{handler, `sluice_tier="1s"`}, {handler, `sluice_tier="2s"`}},
		"sluice_exhausted_total":        {{handler}},
		"sluice_poisoned_total":         {{handler, `error_type="poison"`}},
	} {
		for _, l := range labels {
			require.Equal(t, []string{"0"}, series(m, name, l...), "%s%v at 0 before any traffic", name, l)
		}
	}
	b, err := os.ReadFile("../docs/alerts.yml")
	require.NoError(t, err)
	for _, name := range regexp.MustCompile(`[a-z_]+_total`).FindAllString(string(b), -1) {
		require.NotEmpty(t, series(m, name), "%s, which docs/alerts.yml reads, is exported before any traffic", name)
	}
}
