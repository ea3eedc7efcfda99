package router_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

func TestAddValidates(t *testing.T) {
	t.Parallel()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	sub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = sub.Close() })
	h := func(*message.Message) error { return nil }
	ph := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	ob, err := sluicesql.NewOutbox(sqlx.NewDb(nil, "postgres"), sluicesql.OutboxConfig{})
	require.NoError(t, err)
	liteInbox, err := sluicesql.NewInbox(sqlx.NewDb(nil, "sqlite"), sluicesql.InboxConfig{})
	require.NoError(t, err)
	for _, tt := range []struct {
		cfg  router.HandlerConfig
		want string
	}{
		{router.HandlerConfig{Topic: "t", Subscriber: sub, Handler: h}, "HandlerConfig.Name is required"},
		{router.HandlerConfig{Name: "n", Subscriber: sub, Handler: h}, "HandlerConfig.Topic is required"},
		{router.HandlerConfig{Name: "n", Topic: "t", Handler: h}, "HandlerConfig.Subscriber is required"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub}, "exactly one of HandlerConfig.Handler, HandlerConfig.PublishingHandler and HandlerConfig.BatchHandler"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, PublishingHandler: ph}, "needs PublishTopic"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, PublishingHandler: ph, PublishTopic: "p"}, "needs Outbox (or Publisher)"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, Handler: h, Outbox: ob}, "HandlerConfig.Outbox takes a PublishingHandler's messages"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, PublishingHandler: ph, PublishTopic: "p", Outbox: ob, Publisher: sub}, "HandlerConfig.Outbox and Publisher: give one"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, PublishingHandler: ph, PublishTopic: "p", Outbox: ob}, "HandlerConfig.Outbox needs Stages.Inbox"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, PublishingHandler: ph, PublishTopic: "p", Outbox: ob,
			Stages: router.Stages{Inbox: &deduplication.Config{Store: deduplication.NewMemoryStore()}}}, "the inbox's store is a *deduplication.MemoryStore, whose units of work are no SQL transactions"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, PublishingHandler: ph, PublishTopic: "p", Outbox: ob,
			Stages: router.Stages{Inbox: &deduplication.Config{Store: liteInbox}}}, "the inbox is on sqlite, the outbox on postgres"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, PublishingHandler: ph, PublishTopic: "p", Publisher: sub,
			Stages: router.Stages{Inbox: &deduplication.Config{Store: deduplication.NewMemoryStore()}}}, "Give HandlerConfig.Outbox instead"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, Handler: h, PublishAtMostOnce: true}, "HandlerConfig.PublishAtMostOnce is about a PublishingHandler's messages sent on Publisher"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, Handler: h, Consumers: -1}, "HandlerConfig.Consumers"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, Handler: h, Stages: router.Stages{Inbox: &deduplication.Config{}}}, "router: inbox stage: deduplication: Config.Store is required"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, Handler: h, Stages: router.Stages{Poison: &poison.Config{}}}, "router: poison stage: poison: Config.Publisher is required"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, Handler: h, Stages: router.Stages{Recoverer: &stage.RecovererConfig{Class: sluice.ClassRejected}}}, "router: recoverer stage"},
		{router.HandlerConfig{Name: "n", Topic: "t", Subscriber: sub, Handler: h, Stages: router.Stages{Retry: &retrytiers.Config{}}}, "Stages.Retry needs Stages.Poison"},
	} {
		_, err := router.Add(r, tt.cfg)
		require.ErrorContains(t, err, tt.want)
		if tt.cfg.Stages.Retry != nil || tt.cfg.Publisher != nil && tt.cfg.Stages.Inbox != nil {
			require.ErrorIs(t, err, router.ErrUnsafeStages)
		}
	}
	// The loss accepted by name: Watermill publishes after the commit.
	_, err = router.Add(r, router.HandlerConfig{Name: "at-most-once", Topic: "at-most-once", Subscriber: sub, PublishingHandler: ph, PublishTopic: "p",
		Publisher: sub, PublishAtMostOnce: true, Stages: router.Stages{Inbox: &deduplication.Config{Store: deduplication.NewMemoryStore()}}})
	require.NoError(t, err)

	e, err := embedded.New(embedded.Config{Topic: "orders"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "n", Handler: h, Consumers: 2})
	require.ErrorContains(t, err, "the gochannel broker allows at most 1")
	_, err = embedded.New(embedded.Config{})
	require.ErrorContains(t, err, "embedded: Config.Topic is required")
	_, err = rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{})
	require.ErrorContains(t, err, "BrokerConfig.URL is required")
}

// One MeterProvider and one TracerProvider on the stage set reach every
// stage whose own is unset.
func TestStagesShareTheProviders(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	mws, err := router.Middlewares(router.Stages{
		Env:      sluice.Env{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))},
		Trace:    &stage.TraceConfig{},
		Classify: &stage.ClassifyConfig{},
		Inbox:    &deduplication.Config{Store: deduplication.NewMemoryStore(), Consumer: "c"},
	})
	require.NoError(t, err)
	h := message.HandlerFunc(func(*message.Message) ([]*message.Message, error) {
		return nil, sluice.Reject(errors.New("out of stock"))
	})
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	for range 2 { // a rejection, then its duplicate
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(sluice.EventIDKey, "evt-1")
		m.SetContext(t.Context())
		_, err = h(m)
		require.NoError(t, err)
	}
	require.Len(t, spans.Ended(), 2, "the Trace stage used the shared TracerProvider")
	require.Equal(t, int64(1), testenv.CounterSum(t, reader, telemetry.MetricRejected), "Classify used the shared MeterProvider")
	require.Equal(t, int64(1), testenv.CounterSum(t, reader, telemetry.MetricInboxDuplicates), "so did the inbox")
	require.Equal(t, int64(2), testenv.CounterSum(t, reader, telemetry.MetricConsumed), "and Trace")
}

// Add names the inbox's consumer after the handler when Inbox.Consumer is
// unset, as it does the poison stage's: two handlers sharing one store
// each process the same event once (before, Add refused the Inbox without
// a Consumer).
func TestAddNamesTheInboxConsumerAfterTheHandler(t *testing.T) {
	t.Parallel()
	store := deduplication.NewMemoryStore()
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	ran := make(chan string, 8)
	for _, name := range []string{"billing", "shipping"} {
		_, err := router.Add(r, router.HandlerConfig{Name: name, Topic: name, Subscriber: pubsub,
			Handler: func(*message.Message) error { ran <- name; return nil },
			Stages:  router.Stages{Inbox: &deduplication.Config{Store: store}}})
		require.NoError(t, err)
	}
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
		require.NoError(t, pubsub.Close())
	})
	var got []string
	for _, topic := range []string{"billing", "shipping"} {
		testenv.PublishEvents(t, pubsub, topic, 1) // evt-0 on both
		got = append(got, <-ran)
	}
	require.Equal(t, []string{"billing", "shipping"}, got, "one event id, two consumers: each handler ran once")
}
