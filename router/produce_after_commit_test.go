package router_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
	"github.com/sluicemq/sluice/stage"

	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/sluicesql"
)

// Issue 28, item 3: an assembly router.Add accepts never loses what a
// handler produces. A new user's first full stack — an Inbox, a
// PublishingHandler and the broker's Publisher, no Outbox — lost 4 of 4
// produced events to a NO_ROUTE after the commit: the publish failed, the
// delivery was nacked, its redelivery a duplicate the inbox skipped. Each
// assembly below is either refused (ErrUnsafeStages, naming the outbox) or,
// on RabbitMQ and PostgreSQL, delivers every produced event once the
// destination exists, although every first publish was refused.
func TestNoAssemblyAddAcceptsLosesAProducedEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		withOutbox bool
	}{
		{"a Publisher beside the inbox", false},
		{"the outbox", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			producedAfterANoRoute(t, tc.withOutbox)
		})
	}
}

func producedAfterANoRoute(t *testing.T, withOutbox bool) {
	const events = 4
	db, schema, store := inbox(t)
	queue, produced := testenv.Name("produce"), testenv.Name("produced")
	q := newRabbitMQ(t, queue, 50*time.Millisecond)
	testenv.DeleteQueuesAtEnd(t, produced) // declared only once every first publish was refused
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := router.HandlerConfig{
		Broker: q,
		Name:   "inventory",
		PublishingHandler: func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			id := msg.Metadata.Get(sluice.EventIDKey)
			if _, err := sluicesql.TxFromContext(ctx).ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.reservations (event_key) VALUES ($1)`, schema), id); err != nil {
				return nil, err
			}
			evt := message.NewMessage(watermill.NewUUID(), []byte(`{"reserved":true}`))
			evt.Metadata.Set(sluice.EventIDKey, "reserved:"+id)
			return []*message.Message{evt}, nil
		},
		PublishTopic: produced,
		Stages: router.Stages{
			Env:       sluice.Env{MeterProvider: mp},
			Poison:    &poison.Config{},
			Retry:     &retrytiers.Config{},
			Classify:  &stage.ClassifyConfig{},
			Inbox:     &deduplication.Config{Store: store},
			Recoverer: &stage.RecovererConfig{},
		},
	}
	// Every first publish was refused: the produced events' fate is decided.
	refused := func() bool { return testenv.CounterSum(t, reader, telemetry.MetricInboxDuplicates) >= events }
	if withOutbox {
		ob := testenv.Migrate(t, db, sluicesql.Config{Schema: schema, Outbox: sluicesql.OutboxConfig{Table: "outbox"}}).Outbox
		cfg.Outbox = ob
		relay, err := outbox.NewRelay(ob, q.Publisher(), outbox.RelayConfig{Env: sluice.Env{MeterProvider: mp}, PollInterval: 50 * time.Millisecond, RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
		require.NoError(t, err)
		relayed := make(chan error, 1)
		go func() { relayed <- relay.Run(context.Background()) }()
		t.Cleanup(func() {
			require.NoError(t, relay.Close())
			require.NoError(t, <-relayed)
		})
		refused = func() bool { return testenv.CounterSum(t, reader, telemetry.MetricOutboxFailures) >= events }
	} else {
		cfg.Publisher = q.Publisher()
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	if _, err := router.Add(r, cfg); err != nil {
		require.ErrorIs(t, err, router.ErrUnsafeStages)
		require.ErrorContains(t, err, "HandlerConfig.Outbox")
		require.ErrorContains(t, err, "PublishAtMostOnce", "the opt-in that accepts the loss is named")
		require.False(t, withOutbox, "the outbox is never refused: %v", err)
		return
	}
	done := testenv.RunRouter(context.Background(), r)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	testenv.PublishEvents(t, q.Publisher(), queue, events)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %s.reservations`, schema)))
		return n == events && refused()
	}, 2*time.Minute, 20*time.Millisecond, "every event handled once, every first publish of what it produced refused (NO_ROUTE)")

	conn := testenv.AMQP(t)
	_, err = testenv.Channel(t, conn).QueueDeclare(produced, true, false, false, false, nil)
	require.NoError(t, err)
	got := 0
	for deadline := time.Now().Add(2 * time.Minute); got < events && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got = testenv.QueueDepth(t, conn, produced)
	}
	require.Equal(t, events, got, "an assembly Add accepted lost %d of %d produced events", events-got, events)
}
