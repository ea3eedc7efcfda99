package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/broker"
)

func TestJitteredSpreadsEachTierOverQueuesOfItsOwn(t *testing.T) {
	t.Parallel()
	tiers, err := broker.Ladder("orders")
	require.NoError(t, err)
	jittered, err := broker.Jittered("orders", tiers, broker.Jitter{Fraction: 0.2})
	require.NoError(t, err)
	require.Len(t, jittered, 3)
	require.Equal(t, broker.Tier{Name: "5m", Delay: 5 * time.Minute, Topic: "orders.retry.5m", Waits: []broker.Wait{
		{Delay: 5 * time.Minute, Topic: "orders.retry.5m"},
		{Delay: 4*time.Minute + 40*time.Second, Topic: "orders.retry.4m40s"},
		{Delay: 4*time.Minute + 20*time.Second, Topic: "orders.retry.4m20s"},
		{Delay: 4 * time.Minute, Topic: "orders.retry.4m"},
	}}, jittered[1])
	require.Equal(t, []string{"orders.retry.30s", "orders.retry.28s", "orders.retry.26s", "orders.retry.24s"}, jittered[0].Topics())
	require.Equal(t, []string{"orders.retry.30s"}, tiers[0].Topics(), "the ladder itself is left as it was")

	picked := map[string]int{}
	for range 1000 {
		w := jittered[2].Pick()
		picked[w.Topic]++
		require.LessOrEqual(t, w.Delay, jittered[2].Delay)
	}
	require.Len(t, picked, 4, "every wait is used: %v", picked)
	require.Equal(t, broker.Wait{Delay: 30 * time.Second, Topic: "orders.retry.30s"}, tiers[0].Pick(), "a tier without waits waits in its own queue")

	same, err := broker.Jittered("orders", tiers, broker.Jitter{})
	require.NoError(t, err)
	require.Equal(t, tiers, same, "no jitter by default")
}

func TestJitteredRefuses(t *testing.T) {
	t.Parallel()
	tiers, err := broker.Ladder("q", 30*time.Second, 40*time.Second)
	require.NoError(t, err)
	for _, tc := range []struct {
		j    broker.Jitter
		want string
	}{
		{broker.Jitter{Fraction: -0.1}, "Jitter.Fraction is -0.1"},
		{broker.Jitter{Fraction: 0.6}, "Jitter.Fraction is 0.6"},
		{broker.Jitter{Fraction: 0.1, Queues: 1}, "Jitter.Queues is 1"},
		{broker.Jitter{Fraction: 0.1, Queues: 17}, "Jitter.Queues is 17"},
		{broker.Jitter{Fraction: 0.25, Queues: 2}, `tiers 30s and 40s one wait, "q.retry.30s"`},
	} {
		_, err := broker.Jittered("q", tiers, tc.j)
		require.ErrorContains(t, err, tc.want)
	}
	name := strings.Repeat("q", 244)
	ladder, err := broker.Ladder(name, 5*time.Minute) // "<name>.retry.5m": 253 bytes
	require.NoError(t, err)
	_, err = broker.Jittered(name, ladder, broker.Jitter{Fraction: 0.2}) // "<name>.retry.4m40s": 256
	require.ErrorIs(t, err, broker.ErrNameTooLong)
}
