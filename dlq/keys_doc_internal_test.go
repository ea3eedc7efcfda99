package dlq

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/replay"
)

// The replay provenance keys are not exported: users read them in the table
// of docs/cli.md, "What a replayed message carries", which must list every
// one internal/metakeys defines (sluice_replayed_*, sluice_replay_count),
// each once, and exactly the keys a replay adds to the message it replays.
func TestTheDocsTableListsEveryReplayProvenanceKey(t *testing.T) {
	t.Parallel()
	const header = "| key (AMQP header) | value |"
	table := testenv.TableKeys(t, "../docs/cli.md", header, regexp.MustCompile("`(sluice_[a-z_]+)`"))
	var defined []string
	for _, v := range testenv.StringConstants(t, "../internal/metakeys") {
		if strings.HasPrefix(v, metakeys.ReplayPrefix) && v != metakeys.ReplayPrefix {
			defined = append(defined, v)
		}
	}
	documented := slices.Sorted(slices.Values(table))
	slices.Sort(defined)
	require.Equal(t, defined, documented, "docs/cli.md's table lists the replay provenance keys internal/metakeys defines, each once")

	m := &Message{Msg: message.NewMessage("u-1", []byte(`{}`)), Class: "poison"}
	for k, v := range map[string]string{
		sluice.EventIDKey: "evt-1", sluice.EventTypeKey: "order.created", sluice.AttemptKey: "3",
		metakeys.PoisonClass: "poison", metakeys.PoisonQueue: "orders", metakeys.PoisonedAt: "2026-12-05T10:00:00Z",
		"tenant": "acme",
	} {
		m.Msg.Metadata.Set(k, v)
	}
	c := replayCopy(m, ReplayConfig{queue: "orders.poison", op: Config{Operator: "alice"}}, "orders")
	var added []string
	for k := range c.Metadata {
		if _, ok := m.Msg.Metadata[k]; !ok {
			added = append(added, k)
		}
	}
	slices.Sort(added)
	require.Equal(t, documented, added, "a replay adds the keys docs/cli.md's table lists, and no other")
	require.Equal(t, "1", c.Metadata.Get(metakeys.ReplayCount))
	require.Equal(t, "orders.poison", c.Metadata.Get(metakeys.ReplayedFrom))

	m.Msg.Metadata.Set(metakeys.ReplayCount, "1")
	c = replayCopy(m, ReplayConfig{queue: "orders.poison", op: Config{Operator: "alice"}, Run: "run-1"}, "orders")
	require.Equal(t, "2", c.Metadata.Get(metakeys.ReplayCount), "a replay replayed again")
	require.Equal(t, "run-1", c.Metadata.Get(replay.RunKey), "and a run's replay carries its run")
}
