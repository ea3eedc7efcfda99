package router_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// confirmDestinations collects reader and returns the
// messaging.destination.name of every data point of the publisher's
// confirm-latency histogram.
func confirmDestinations(t *testing.T, reader *sdkmetric.ManualReader) []string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var out []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != telemetry.MetricPublishConfirmDuration {
				continue
			}
			for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				v, _ := dp.Attributes.Value(attribute.Key("messaging.destination.name"))
				out = append(out, v.AsString())
			}
		}
	}
	return out
}

// TestOneMeterProviderReachesTheBroker sets a MeterProvider once, on the
// stages: the broker's confirmed publisher, built before router.Add, records
// the poison copy's confirm latency with it too (before, it recorded with the
// global provider, and the dashboard's confirm-latency panel stayed empty),
// and the stages' counters carry the join attributes.
func TestOneMeterProviderReachesTheBroker(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("metered")
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL},
		Topology:   rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{100 * time.Millisecond}},
	})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.100ms")
	reader := sdkmetric.NewManualReader()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker:  q,
		Name:    "inventory",
		Handler: func(*message.Message) error { return sluice.Poison(errors.New("malformed")) },
		Stages: router.Stages{
			Env:      sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
			Trace:    &stage.TraceConfig{},
			Poison:   &poison.Config{},
			Retry:    &retrytiers.Config{},
			Classify: &stage.ClassifyConfig{},
		},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)

	// Published with a publisher of its own: its confirm is not the broker's.
	producer, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	defer func() { _ = producer.Close() }()
	require.NoError(t, producer.Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(`{}`))))

	require.Eventually(t, func() bool { return testenv.CounterSum(t, reader, telemetry.MetricPoisoned) == 1 }, time.Minute, 20*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, q.Close())

	require.Equal(t, []string{queue + ".poison"}, confirmDestinations(t, reader), "the poison copy's confirm, recorded with the stages' provider")
	require.Equal(t, int64(1), testenv.CounterWhere(t, reader, telemetry.MetricPoisoned, "messaging.destination.name", queue))
	require.Equal(t, int64(1), testenv.CounterWhere(t, reader, telemetry.MetricPoisoned, "messaging.system", "rabbitmq"))
	require.Equal(t, int64(1), testenv.CounterWhere(t, reader, telemetry.MetricPoisoned, "error.type", "poison"))
	require.Equal(t, int64(1), testenv.CounterWhere(t, reader, telemetry.MetricConsumed, "messaging.operation.name", "process"))
}

// TestBrokersOwnMeterProviderWins: a BrokerConfig.MeterProvider is kept,
// whatever provider the stages have.
func TestBrokersOwnMeterProviderWins(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("ownmeter")
	own := sdkmetric.NewManualReader()
	q, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{
		Connection: rabbitmq.Connection{URL: testenv.AMQPURL, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(own))},
		Topology:   rabbitmq.TopologyConfig{Queue: queue},
	})
	require.NoError(t, err)
	defer func() { _ = q.Close() }()
	testenv.DeleteQueuesAtEnd(t, queueNames(q.Topology())...)
	stages := sdkmetric.NewManualReader()
	require.NoError(t, q.UseMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(stages))))
	require.NoError(t, q.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(`{}`))))
	require.Equal(t, []string{queue}, confirmDestinations(t, own))
	require.Empty(t, confirmDestinations(t, stages))
}
