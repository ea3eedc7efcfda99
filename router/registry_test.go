package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// Two routers in one process name their handlers independently: one with
// handler "orders" and two competing consumers (Watermill handlers
// "orders-0", "orders-1"), another with a handler named "orders-0". Each
// router's metrics carry its own handler name. A process-wide registry of
// instance names (before) labelled one router's deliveries with the other's
// name.
func TestTwoRoutersNameTheirHandlersIndependently(t *testing.T) {
	t.Parallel()
	type run struct {
		name      string
		consumers int
		reader    *sdkmetric.ManualReader
		pubsub    *gochannel.GoChannel
	}
	runs := []*run{{name: "orders", consumers: 2}, {name: "orders-0", consumers: 1}}
	for _, rn := range runs {
		rn.reader = sdkmetric.NewManualReader()
		rn.pubsub = gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
		require.NoError(t, err)
		_, err = router.Add(r, router.HandlerConfig{
			Name: rn.name, Topic: "in", Subscriber: rn.pubsub, Consumers: rn.consumers,
			Handler: func(*message.Message) error { return nil },
			Stages:  router.Stages{Trace: &stage.TraceConfig{}, Env: sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(rn.reader))}},
		})
		require.NoError(t, err)
		done := testenv.RunRouter(context.Background(), r)
		t.Cleanup(func() {
			require.NoError(t, r.Close())
			require.NoError(t, <-done)
			require.NoError(t, rn.pubsub.Close())
		})
	}
	for _, rn := range runs {
		testenv.PublishEvents(t, rn.pubsub, "in", 5)
		want := int64(5 * rn.consumers) // GoChannel gives every subscriber each message
		require.Eventually(t, func() bool { return testenv.CounterSum(t, rn.reader, telemetry.MetricConsumed) == want },
			time.Minute, 5*time.Millisecond, "router of %q: its deliveries", rn.name)
		require.Equal(t, []string{rn.name}, testenv.AttributeValues(t, rn.reader, telemetry.MetricConsumed, "messaging.consumer.group.name"),
			"the router of handler %q labels its deliveries with its own handler's name", rn.name)
	}
}
