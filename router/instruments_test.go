package router_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// alertCounters returns the counters docs/alerts.yml reads (their
// Prometheus names, "<name>_total"), each with the label matchers of its
// first use.
func alertCounters(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../docs/alerts.yml")
	require.NoError(t, err)
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`([a-z_]+_total)(\{[^}]*\})?`).FindAllStringSubmatch(string(b), -1) {
		if _, seen := out[m[1]]; !seen {
			out[m[1]] = m[2]
		}
	}
	return out
}

// promName is the name the OpenTelemetry Prometheus exporter gives the
// counter name (with a unit in braces, which it leaves out).
func promName(name string) string { return strings.ReplaceAll(name, ".", "_") + "_total" }

// handlerPoints collects reader and returns, by Prometheus name, the int64
// counters' data points of the handler.
func handlerPoints(t *testing.T, reader *sdkmetric.ManualReader, handler string) map[string][]metricdata.DataPoint[int64] {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string][]metricdata.DataPoint[int64]{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				if v, _ := dp.Attributes.Value("messaging.consumer.group.name"); v.AsString() == handler {
					out[promName(m.Name)] = append(out[promName(m.Name)], dp)
				}
			}
		}
	}
	return out
}

// relayCounters are the counters the alerts read that are the outbox
// relay's, by outbox table, not a handler's: the relay exports them.
var relayCounters = []string{"sluice_outbox_failures_total"}

// Every counter a shipped alert reads exists at zero for a handler as soon
// as router.Add returned, before its first delivery — one series for each
// label set a delivery can increment: the first poisoning then moves a
// series Prometheus already has, and SluicePoisonRateRising's rate sees it
// (before, the series appeared at its first increment, and a rate over a
// series' first sample is nothing). The deliveries that follow increment
// those series and add none.
func TestTheCountersAlertsReadExistAtZeroBeforeTheFirstDelivery(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("at_zero")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{100 * time.Millisecond}},
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.100ms")
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	var handled atomic.Int64
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "inventory",
		Handler: func(msg *message.Message) error {
			handled.Add(1)
			switch msg.Metadata.Get(sluice.EventIDKey) {
			case "poison":
				return sluice.Poison(errors.New("malformed"))
			case "invariant":
				return sluice.Invariant(errors.New("the order must exist"))
			}
			return nil
		},
		Stages: router.Stages{
			Env:      sluice.Env{MeterProvider: mp},
			Trace:    &stage.TraceConfig{},
			Poison:   &poison.Config{},
			Retry:    &retrytiers.Config{},
			Classify: &stage.ClassifyConfig{},
		},
	})
	require.NoError(t, err)

	before := handlerPoints(t, reader, "inventory")
	alerts := alertCounters(t)
	require.Contains(t, alerts, promName(telemetry.MetricPoisoned), "docs/alerts.yml read")
	for name, matchers := range alerts {
		if slices.Contains(relayCounters, name) {
			continue
		}
		points := before[name]
		require.NotEmpty(t, points, "%s, which an alert reads, has no series for the handler before its first delivery", name)
		for _, dp := range points {
			require.Zero(t, dp.Value, name)
			dest, _ := dp.Attributes.Value("messaging.destination.name")
			require.Equal(t, queue, dest.AsString(), name)
			system, _ := dp.Attributes.Value("messaging.system")
			require.Equal(t, "rabbitmq", system.AsString(), name)
		}
		for _, m := range regexp.MustCompile(`([a-z_]+)="([^"]*)"`).FindAllStringSubmatch(matchers, -1) {
			require.True(t, slices.ContainsFunc(points, func(dp metricdata.DataPoint[int64]) bool {
				v, ok := dp.Attributes.Value(attribute.Key(strings.ReplaceAll(m[1], "_", ".")))
				return ok && v.AsString() == m[2]
			}), "%s has no zero series the alert's %s selects", name, m[0])
		}
	}
	classes := func(points []metricdata.DataPoint[int64]) []string {
		var out []string
		for _, dp := range points {
			v, _ := dp.Attributes.Value("error.type")
			out = append(out, v.AsString())
		}
		slices.Sort(out)
		return out
	}
	require.Equal(t, []string{"exhausted", "invariant", "poison"}, classes(before[promName(telemetry.MetricPoisoned)]))

	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
		require.NoError(t, q.Close())
	})
	for _, id := range []string{"poison", "invariant", "fine"} {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, id)
		require.NoError(t, q.Publisher().Publish(queue, m))
	}
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, testenv.AMQP(t), queue+".poison") == 2 }, time.Minute, 20*time.Millisecond)
	// The stage counts a poisoning once its copy's confirm is back, a
	// moment after the broker shows the copy: wait for the count (run 10 of
	// the loaded series read 1 of 2 as the queue showed both).
	var after map[string][]metricdata.DataPoint[int64]
	require.Eventually(t, func() bool {
		after = handlerPoints(t, reader, "inventory")
		return sumOf(after[promName(telemetry.MetricPoisoned)]) == 2
	}, time.Minute, 20*time.Millisecond, "both poisonings counted")
	require.Len(t, after[promName(telemetry.MetricPoisoned)], len(before[promName(telemetry.MetricPoisoned)]),
		"the poisonings incremented the series exported at zero: none was added")
}

func sumOf(points []metricdata.DataPoint[int64]) int64 {
	var total int64
	for _, dp := range points {
		total += dp.Value
	}
	return total
}

// A failure that reaches the router (nacked) increments the series of
// failed deliveries exported at zero, and adds none.
func TestAFailedDeliveryIncrementsItsSeriesExportedAtZero(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("failed_at_zero")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{100 * time.Millisecond}},
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.100ms")
	reader := sdkmetric.NewManualReader()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	var calls atomic.Int64
	_, err = router.Add(r, router.HandlerConfig{
		Broker: q,
		Name:   "billing",
		Handler: func(*message.Message) error {
			if calls.Add(1) == 1 { // no retry stage: the failure reaches the router, nacked
				return sluice.Transient(errors.New("timeout"))
			}
			return nil
		},
		Stages: router.Stages{Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}, Trace: &stage.TraceConfig{}},
	})
	require.NoError(t, err)
	failed := func(points []metricdata.DataPoint[int64]) (n int64, series int) {
		for _, dp := range points {
			if v, _ := dp.Attributes.Value(telemetry.AttrOutcome); v.AsString() == string(sluice.OutcomeFailed) {
				n, series = n+dp.Value, series+1
			}
		}
		return n, series
	}
	consumed := promName(telemetry.MetricConsumed)
	n, before := failed(handlerPoints(t, reader, "billing")[consumed])
	require.Zero(t, n)
	require.Equal(t, 6, before, "one failed series per class, and one of no class")

	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
		require.NoError(t, q.Close())
	})
	m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	m.Metadata.Set(sluice.EventIDKey, "evt-1")
	require.NoError(t, q.Publisher().Publish(queue, m))
	require.Eventually(t, func() bool { return calls.Load() >= 2 }, time.Minute, 20*time.Millisecond, "nacked, then handled")
	n, after := failed(handlerPoints(t, reader, "billing")[consumed])
	require.Equal(t, int64(1), n)
	require.Equal(t, before, after, "the failure incremented a series exported at zero")
}

// Stages added by hand (the README's quick start) get the same series at
// zero from one call with the configs they were built from: each counter
// an alert reads, with the handler's join attributes and nothing counted.
// Before, it took four functions of four packages (poison.ExportAtZero,
// stage.ExportTraceAtZero, retrytiers.ExportAtZero,
// deduplication.ExportDuplicatesAtZero).
func TestExportCountersAtZeroForStagesAddedByHand(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tiers, err := broker.Ladder("orders", time.Second, time.Minute)
	require.NoError(t, err)
	require.NoError(t, router.ExportCountersAtZero("by-hand", "orders", "rabbitmq", router.Stages{
		Env:    sluice.Env{MeterProvider: mp},
		Trace:  &stage.TraceConfig{},
		Poison: &poison.Config{Classes: []sluice.Class{sluice.ClassPoison}},
		Retry:  &retrytiers.Config{Tiers: tiers},
		Inbox:  &deduplication.Config{},
	}))
	points := handlerPoints(t, reader, "by-hand")
	for name, matchers := range alertCounters(t) {
		if slices.Contains(relayCounters, name) {
			continue
		}
		require.NotEmpty(t, points[name], "%s (an alert reads it%s) has no series", name, matchers)
	}
	count := map[string]int{}
	for name, dps := range points {
		for _, dp := range dps {
			require.Zero(t, dp.Value, name)
			dest, _ := dp.Attributes.Value("messaging.destination.name")
			require.Equal(t, "orders", dest.AsString(), name)
		}
		count[name] = len(dps)
	}
	require.Equal(t, 1, count[promName(telemetry.MetricPoisoned)], "the classes the stage isolates: poison only")
	require.Equal(t, len(tiers), count[promName(telemetry.MetricRetries)], "a series for each tier")
	require.Equal(t, 1, count[promName(telemetry.MetricExhausted)])
	require.Equal(t, 1, count[promName(telemetry.MetricInboxDuplicates)])
	require.Equal(t, 6, count["messaging_client_consumed_messages_total"], "failed deliveries of each of the 5 classes and of none")
}
