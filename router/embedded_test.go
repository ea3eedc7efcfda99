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
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// runEmbedded runs a handler on the embedded default and returns it with a
// function that closes the router.
func runEmbedded(t *testing.T, cfg embedded.Config, handler message.NoPublishHandlerFunc) (*embedded.Broker, func()) {
	t.Helper()
	e, err := embedded.New(cfg)
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{Broker: e, Name: "inventory", Handler: handler, Stages: router.Stages{
		Poison: &poison.Config{}, Retry: &retrytiers.Config{Env: sluice.Env{PublishBackoff: time.Millisecond}}, Classify: &stage.ClassifyConfig{},
	}})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
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

// Copies whose delay ends after the router closed reach no handler: they
// wait in the topic, and Close names them (no retry copy is lost silently).
// A copy back before the router closed fails again and is poisoned
// (exhausted): every event is in one place or the other.
func TestEmbeddedCloseReportsCopiesBackAfterTheRouterClosed(t *testing.T) {
	t.Parallel()
	var handled atomic.Int64
	e, stop := runEmbedded(t, embedded.Config{Topic: "orders", TierDelays: []time.Duration{500 * time.Millisecond}},
		func(*message.Message) error { handled.Add(1); return sluice.Transient(errors.New("down")) })
	testenv.PublishEvents(t, e.PubSub(), "orders", 100)
	require.Eventually(t, func() bool { return handled.Load() >= 100 }, time.Minute, time.Millisecond)
	stop() // the last copy parked just now: it comes back after the router closed
	atClose := handled.Load()
	require.Eventually(t, func() bool { return e.PendingRetries() == 0 }, time.Minute, 5*time.Millisecond,
		"the delays end with no handler running")
	err := e.Close()
	var unfinished *embedded.UnfinishedError
	require.ErrorAs(t, err, &unfinished)
	require.NotEmpty(t, unfinished.Queued)
	require.Empty(t, unfinished.InFlight)
	require.Equal(t, 100, len(unfinished.Queued)+len(e.Poisoned()), "every event is reported or poisoned")
	require.ErrorContains(t, err, fmt.Sprintf("%d deliveries not acked", len(unfinished.Queued)))
	require.Equal(t, atClose, handled.Load(), "no copy was delivered after the router closed")
}

// The in-process tiers are bounded: beyond MaxPendingRetries the retry stage
// nacks (back-pressure), and every event still ends in a tier or is retried.
func TestEmbeddedTiersAreBounded(t *testing.T) {
	t.Parallel()
	var handled atomic.Int64
	e, stop := runEmbedded(t, embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Hour}, MaxPendingRetries: 10},
		func(*message.Message) error { handled.Add(1); return sluice.Transient(errors.New("down")) })
	testenv.PublishEvents(t, e.PubSub(), "orders", 20)
	require.Eventually(t, func() bool { return handled.Load() >= 40 }, time.Minute, time.Millisecond,
		"the ten over the bound are nacked and redelivered")
	require.Equal(t, 10, e.PendingRetries())
	stop()
	require.ErrorContains(t, e.Close(), "10 still waiting at Close")
}
