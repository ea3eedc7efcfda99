package republish_test

import (
	"regexp"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/republish"
)

func delivery(uuid string, md map[string]string) *message.Message {
	m := message.NewMessage(uuid, []byte("payload"))
	for k, v := range md {
		m.Metadata.Set(k, v)
	}
	return m
}

// A copy's identity is derived from the delivery: every delivery of one
// message gives the same, and what makes two copies different things — the
// event, the attempt, the kind, a replay — gives another.
func TestIDIsDerivedFromTheDelivery(t *testing.T) {
	t.Parallel()
	base := map[string]string{sluice.EventIDKey: "evt-1", sluice.AttemptKey: "2"}
	id := republish.ID(delivery("u1", base), republish.KindRetry)
	require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`), id, "a version 8 UUID")
	require.Equal(t, id, republish.ID(delivery("u1", base), republish.KindRetry), "a redelivery: the same identity")
	require.Equal(t, id, republish.ID(delivery("u2", base), republish.KindRetry), "the event id, not the message id, when there is one")

	with := func(k, v string) map[string]string {
		md := map[string]string{}
		for k, v := range base {
			md[k] = v
		}
		md[k] = v
		return md
	}
	for name, other := range map[string]string{
		"kind":     republish.ID(delivery("u1", base), republish.KindPoison),
		"event":    republish.ID(delivery("u1", with(sluice.EventIDKey, "evt-2")), republish.KindRetry),
		"attempt":  republish.ID(delivery("u1", with(sluice.AttemptKey, "3")), republish.KindRetry),
		"replayed": republish.ID(delivery("u1", with(metakeys.ReplayPrefix+"_run", "run-1")), republish.KindRetry),
	} {
		require.NotEqual(t, id, other, name)
	}

	// Without an event id, the message id: a copy's own identity carries
	// the chain on.
	noEvent := map[string]string{}
	require.Equal(t, republish.ID(delivery("u1", noEvent), republish.KindRetry), republish.ID(delivery("u1", noEvent), republish.KindRetry))
	require.NotEqual(t, republish.ID(delivery("u1", noEvent), republish.KindRetry), republish.ID(delivery("u2", noEvent), republish.KindRetry))
	require.Equal(t, republish.ID(delivery("u1", noEvent), republish.KindRetry),
		republish.ID(delivery("u1", map[string]string{sluice.AttemptKey: "1"}), republish.KindRetry), "attempt absent is attempt 1")
}

// Identify stamps the identity as the copy's UUID and CopyIDKey.
func TestIdentify(t *testing.T) {
	t.Parallel()
	msg := delivery("u1", map[string]string{sluice.EventIDKey: "evt-1"})
	c := republish.Copy(msg, 1)
	require.NotEqual(t, "u1", c.UUID)
	republish.Identify(c, msg, republish.KindPoison)
	require.Equal(t, republish.ID(msg, republish.KindPoison), c.UUID)
	require.Equal(t, c.UUID, c.Metadata.Get(sluice.CopyIDKey))
}
