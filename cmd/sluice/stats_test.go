package main

import (
	"encoding/json"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
)

// A poison queue of many distinct reasons: stats shows --top of them and
// one (other) row, as a table and as JSON, and says nothing was left out
// uncounted (issue 18, item 11: every distinct reason was a row, 400,000
// lines and 1.09 GB for 200,000 messages).
func TestStatsShowsTheTopFingerprintsAndOther(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ch := testenv.Channel(t, testenv.AMQP(t))
	publish := func(reason string) {
		require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", b.topo.Config().PoisonQueue, false, false, amqp.Publishing{
			Headers: amqp.Table{metakeys.PoisonClass: "exhausted", metakeys.PoisonReason: reason}}))
	}
	for i := range 40 {
		if i%4 == 0 {
			publish("timeout after 4 attempts")
		} else {
			publish("order " + strings.Repeat("k", i) + " cannot be priced")
		}
	}
	code, out, errOut := b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--top", "3", "--json")
	require.Equal(t, 0, code, errOut)
	var s dlq.Stats
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.Equal(t, 40, s.Total)
	require.Len(t, s.ByFingerprint, 3, "the top 3 rows")
	require.Equal(t, 10, s.ByFingerprint["timeout after # attempts"])
	require.Equal(t, 28, s.Other.Fingerprint, "the 28 others in one count")
	require.Empty(t, s.Approximate, "few enough values: exact")

	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--top", "3")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "(other)")
	require.Less(t, strings.Count(out, "cannot be priced"), 3, "not a row per reason:\n%s", out)
	require.Equal(t, 40, testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().PoisonQueue), "nothing removed")

	code, _, errOut = b.cli(t, "dlq", "stats", "--queue", b.topo.Config().PoisonQueue, "--top", "0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--top 0: want 1 to 1000")
}
