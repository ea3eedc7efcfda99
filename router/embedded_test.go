package router_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/middleware"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
)

// runEmbedded runs a handler on the embedded default and returns it with a
// function that closes the router.
func runEmbedded(t *testing.T, cfg router.EmbeddedConfig, handler message.NoPublishHandlerFunc) (*router.Embedded, func()) {
	t.Helper()
	e, err := router.NewEmbedded(cfg)
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "inventory", Handler: handler, Stages: router.Stages{
		Poison: &poison.Config{}, Retry: &retrytiers.Config{PublishBackoff: time.Millisecond}, Classify: &middleware.ClassifyConfig{},
	}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	closed := false
	stop := func() {
		if !closed {
			closed = true
			require.NoError(t, r.Close())
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(stop)
	return e, stop
}

func publishN(t *testing.T, e *router.Embedded, n int) {
	t.Helper()
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		require.NoError(t, e.PubSub.Publish("orders", m))
	}
}

// Copies whose delay ends after the router closed reach no handler: they
// are not published into a GoChannel that would drop them silently, and
// Close says how many were dropped.
func TestEmbeddedCloseReportsCopiesDroppedAfterTheRouterClosed(t *testing.T) {
	t.Parallel()
	var handled atomic.Int64
	e, stop := runEmbedded(t, router.EmbeddedConfig{Topic: "orders", TierDelays: []time.Duration{300 * time.Millisecond}},
		func(*message.Message) error { handled.Add(1); return sluice.Transient(errors.New("down")) })
	publishN(t, e, 100)
	require.Eventually(t, func() bool { return e.PendingRetries() == 100 }, 5*time.Second, 5*time.Millisecond)
	stop()
	require.Eventually(t, func() bool { return e.PendingRetries() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the delays end with no handler running")
	err := e.Close()
	require.ErrorContains(t, err, "dropped 100 messages")
	require.ErrorContains(t, err, "100 refused by the target")
	require.Equal(t, int64(100), handled.Load(), "no copy was delivered after the router closed")
}

// The in-process tiers are bounded: beyond MaxPendingRetries the retry stage
// nacks (back-pressure), and every event still ends in a tier or is retried.
func TestEmbeddedTiersAreBounded(t *testing.T) {
	t.Parallel()
	var handled atomic.Int64
	e, stop := runEmbedded(t, router.EmbeddedConfig{Topic: "orders", TierDelays: []time.Duration{time.Hour}, MaxPendingRetries: 10},
		func(*message.Message) error { handled.Add(1); return sluice.Transient(errors.New("down")) })
	publishN(t, e, 20)
	require.Eventually(t, func() bool { return handled.Load() >= 40 }, 5*time.Second, time.Millisecond,
		"the ten over the bound are nacked and redelivered")
	require.Equal(t, 10, e.PendingRetries())
	stop()
	require.ErrorContains(t, e.Close(), "10 still waiting at Close")
}
