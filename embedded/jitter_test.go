package embedded_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// The embedded default's jittered tier: every copy comes back through one
// of the tier's waits, the tier named as before.
func TestEmbeddedJitteredTier(t *testing.T) {
	t.Parallel()
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{40 * time.Millisecond},
		TierJitter: broker.Jitter{Fraction: 0.5, Queues: 2}})
	require.NoError(t, err)
	waits := e.Endpoints().Tiers[0].Topics()
	require.Equal(t, []string{"orders.retry.40ms", "orders.retry.20ms"}, waits)
	var mu sync.Mutex
	from := map[string]int{}
	r, done, _ := embeddedRouter(t, e, router.Stages{Retry: &retrytiers.Config{}, Poison: &poison.Config{}, Classify: &stage.ClassifyConfig{}},
		func(msg *message.Message) error {
			if msg.Metadata.Get(sluice.AttemptKey) == "" {
				return sluice.Transient(errors.New("down"))
			}
			mu.Lock()
			defer mu.Unlock()
			from[msg.Metadata.Get(metakeys.DeadLetterQueue)]++
			return nil
		})
	testenv.PublishEvents(t, e.PubSub(), "orders", 60)
	require.NoError(t, testenv.AwaitCount(60, time.Minute, 10*time.Minute, func() int {
		mu.Lock()
		defer mu.Unlock()
		return from[waits[0]] + from[waits[1]]
	}), "every event back from one of the tier's waits")
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, e.Close())
	require.Positive(t, from[waits[0]])
	require.Positive(t, from[waits[1]])
}
