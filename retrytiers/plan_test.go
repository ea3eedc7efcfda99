package retrytiers_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/retrytiers"
)

// parked returns the one copy pub holds, its topic, and forgets it.
func parked(t *testing.T, pub *recorder) (string, *message.Message) {
	t.Helper()
	pub.mu.Lock()
	defer pub.mu.Unlock()
	require.Len(t, pub.got, 1, "one topic: %v", pub.got)
	for topic, msgs := range pub.got {
		require.Len(t, msgs, 1)
		delete(pub.got, topic)
		return topic, back(msgs[0], topic)
	}
	return "", nil
}

// A failure that says when to come back goes to the nearest tier that waits
// at least that long — later or earlier than the ladder's next — and the
// attempt counts the tiers it skipped; one that asks more than the longest
// tier waits goes there, and the next failure spends the budget.
func TestRetryAfterGoesToTheNearestTierThatWaitsLongEnough(t *testing.T) {
	t.Parallel()
	pub := &recorder{}
	mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: tiers(t)}) // 30s, 5m, 1h30m
	require.NoError(t, err)
	limited := errors.New("429 Too Many Requests")

	msg := message.NewMessage("uuid-1", []byte("{}"))
	msg.Metadata.Set(sluice.EventIDKey, "evt-1")
	_, err = run(mw, msg, sluice.RetryAfter(limited, 2*time.Minute))
	require.NoError(t, err)
	topic, c := parked(t, pub)
	require.Equal(t, "orders.retry.5m", topic, "30s is too short: the next that waits 2m")
	require.Equal(t, "3", c.Metadata.Get(sluice.AttemptKey), "the 30s tier's attempt is spent")
	require.Equal(t, "5m", c.Metadata.Get(sluice.RetryTierKey))

	_, err = run(mw, c, sluice.RetryAfter(limited, 10*time.Second))
	require.NoError(t, err)
	topic, c = parked(t, pub)
	require.Equal(t, "orders.retry.30s", topic, "an earlier tier, when it waits long enough")
	require.Equal(t, "4", c.Metadata.Get(sluice.AttemptKey), "no attempt is given back")

	fresh := message.NewMessage("uuid-2", []byte("{}"))
	_, err = run(mw, fresh, sluice.RetryAfter(limited, 3*time.Hour))
	require.NoError(t, err)
	topic, c = parked(t, pub)
	require.Equal(t, "orders.retry.1h30m", topic, "no tier waits 3h: the longest")
	require.Equal(t, "4", c.Metadata.Get(sluice.AttemptKey))
	_, err = run(mw, c, sluice.Transient(limited))
	require.Equal(t, sluice.ClassExhausted, sluice.ClassOf(err), "the budget is spent")
}

// With jittered tiers a copy waits in one of its tier's queues, every one
// of them used; a Retry-After picks among the waits long enough only.
func TestJitteredTiersSpreadTheCopies(t *testing.T) {
	t.Parallel()
	ladder, err := broker.Ladder("orders", 30*time.Second, 5*time.Minute)
	require.NoError(t, err)
	jittered, err := broker.Jittered("orders", ladder, broker.Jitter{Fraction: 0.2}) // 30s 28s 26s 24s; 5m 4m40s 4m20s 4m
	require.NoError(t, err)
	pub := &recorder{}
	mw, err := retrytiers.New(retrytiers.Config{Publisher: pub, Tiers: jittered})
	require.NoError(t, err)
	for range 200 {
		_, err = run(mw, message.NewMessage("uuid", nil), sluice.Transient(errors.New("timeout")))
		require.NoError(t, err)
		_, err = run(mw, message.NewMessage("uuid", nil), sluice.RetryAfter(errors.New("429"), 27*time.Second))
		require.NoError(t, err)
	}
	counts := map[string]int{}
	for topic, msgs := range pub.got {
		counts[topic] = len(msgs)
		for _, m := range msgs {
			require.Equal(t, "30s", m.Metadata.Get(sluice.RetryTierKey), "the tier's name, whichever of its queues")
		}
	}
	require.Len(t, counts, 4, "%v", counts)
	require.Equal(t, 400, counts["orders.retry.30s"]+counts["orders.retry.28s"]+counts["orders.retry.26s"]+counts["orders.retry.24s"])
	require.Greater(t, counts["orders.retry.30s"]+counts["orders.retry.28s"], 200, "the Retry-After copies wait 28s or 30s only: %v", counts)

	// A copy back from any of a tier's queues is Sluice's: its attempt is believed.
	c := back(pub.got["orders.retry.24s"][0], "orders.retry.24s")
	pub.got = nil
	_, err = run(mw, c, sluice.Transient(errors.New("timeout")))
	require.NoError(t, err)
	topic, c := parked(t, pub)
	require.Contains(t, jittered[1].Topics(), topic)
	require.Equal(t, "3", c.Metadata.Get(sluice.AttemptKey))
}
