package dlq_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
)

// Two entries with one copy identity — a delivery's poison copy made twice
// after an uncertain publish — are two messages and one item, in stats and
// in a replay run (the item: the event id, else the message id, which is
// the copy's identity).
func TestTwoCopiesWithOneIdentityAreOneItem(t *testing.T) {
	t.Parallel()
	entry := func(uuid, copyID, eventID string) *dlq.Message {
		m := message.NewMessage(uuid, nil)
		if copyID != "" {
			m.Metadata.Set(sluice.CopyIDKey, copyID)
		}
		return &dlq.Message{Msg: m, Class: "poison", Reason: "unknown version 7", EventID: eventID}
	}
	twice := []*dlq.Message{entry("c1", "c1", ""), entry("c1", "c1", "")}
	c := dlq.NewStatsCounter(dlq.Filter{}, 0)
	for _, m := range append(twice,
		entry("c2", "c2", "evt-2"),
		entry(watermill.NewUUID(), "", ""), // an entry without an identity: its message id
		entry(watermill.NewUUID(), "", ""),
	) {
		c.Add(m)
	}
	s := c.Stats()
	require.Equal(t, 5, s.Total)
	require.Equal(t, 4, s.Items, "the two copies of one delivery count once")
	require.Empty(t, s.Approximate)
	require.Equal(t, twice[0].Item(), twice[1].Item(), "one replay item")
}
