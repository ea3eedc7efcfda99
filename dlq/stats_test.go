package dlq_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/dlq"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func poisoned(reason, eventType string) *dlq.Message {
	return &dlq.Message{Msg: message.NewMessage(watermill.NewUUID(), nil), Class: "poison", Reason: reason, EventType: eventType}
}

// distinct is a reason no other i gives, even fingerprinted (letters only:
// Fingerprint turns digits into #).
func distinct(i int) string {
	var b strings.Builder
	b.WriteString("order ")
	for ; i > 0 || b.Len() == 6; i /= 20 {
		b.WriteByte(byte('g' + i%20)) // g..z: not hex either
	}
	b.WriteString(" failed")
	return b.String()
}

// 12,000 messages with 10,000 distinct reasons and two frequent ones, shown
// top 5: the counter never holds more than its capacity, the frequent
// reasons are found, five rows are kept and the rest is one (other) count
// (issue 18, item 11: the map used to hold every distinct reason).
func TestStatsKeepsTopFingerprintsInBoundedMemory(t *testing.T) {
	t.Parallel()
	c := dlq.NewStatsCounter(dlq.Filter{}, 5)
	bound := 3 * dlq.Capacity(5)
	maxTracked := 0
	for i := range 15_000 {
		switch {
		case i%5 == 1:
			c.Add(poisoned("timeout after 4 attempts", "order.created"))
		case i%5 == 3 && i < 10_000:
			c.Add(poisoned("missing field sku", "order.created"))
		default:
			c.Add(poisoned(distinct(i), distinct(i)))
		}
		maxTracked = max(maxTracked, c.Tracked())
	}
	require.LessOrEqual(t, maxTracked, bound, "at most Capacity values a group, whatever the queue holds")
	s := c.Stats()
	require.Equal(t, 15_000, s.Total)
	require.Len(t, s.ByFingerprint, 5, "the top 5 rows, not 10,000")
	require.LessOrEqual(t, len(s.ByEventType), 5)
	require.Equal(t, []string{"fingerprint", "event_type"}, s.Approximate)
	slack := s.Total / (dlq.Capacity(5) + 1)
	require.InDelta(t, 3000, s.ByFingerprint["timeout after # attempts"], float64(slack), "found, short by at most Total/(Capacity+1)")
	require.LessOrEqual(t, s.ByFingerprint["timeout after # attempts"], 3000)
	require.InDelta(t, 2000, s.ByFingerprint["missing field sku"], float64(slack))
	sum := 0
	for _, n := range s.ByFingerprint {
		sum += n
	}
	require.Equal(t, s.Total, sum+s.Other.Fingerprint, "every message counted once: shown or other")
	require.Equal(t, map[string]int{"poison": 15_000}, s.ByClass)
	require.Equal(t, 0, s.Other.Class)
}

// Few distinct values: exact counts, the top kept, the rest in other.
func TestStatsExactWithFewValues(t *testing.T) {
	t.Parallel()
	c := dlq.NewStatsCounter(dlq.Filter{}, 2)
	for i, n := range []int{5, 4, 3, 1} {
		for range n {
			c.Add(poisoned(strings.Repeat("e", i+1), ""))
		}
	}
	s := c.Stats()
	require.Equal(t, map[string]int{"e": 5, "ee": 4}, s.ByFingerprint)
	require.Equal(t, 4, s.Other.Fingerprint)
	require.Equal(t, map[string]int{"(none)": 13}, s.ByEventType)
	require.Empty(t, s.Approximate)
	require.Equal(t, 2, s.Top)
	require.Equal(t, dlq.TopDefault, dlq.NewStatsCounter(dlq.Filter{}, 0).Stats().Top)
}

// Stats says the top it used and the values it tracked a group for it
// (Stats.Capacity, which the CLI prints beside approximate counts): 0 is
// the default, more than the most is taken as the most.
func TestStatsSaysItsTopAndCapacity(t *testing.T) {
	t.Parallel()
	none := func(func(*dlq.Message) bool) {}
	for _, c := range []struct{ top, wantTop, wantCapacity int }{
		{0, 20, 1000}, {5, 5, 1000}, {100, 100, 5000}, {1000, 1000, 50000}, {5000, 1000, 50000},
	} {
		s := dlq.StatsOf(dlq.Filter{}, c.top, none)
		require.Equal(t, c.wantTop, s.Top, "top %d", c.top)
		require.Equal(t, c.wantCapacity, s.Capacity, "top %d", c.top)
		require.Equal(t, dlq.Capacity(s.Top), s.Capacity)
	}
}
