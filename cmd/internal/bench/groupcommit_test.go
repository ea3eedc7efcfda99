package bench

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The groupcommit and consumer-inbox suites run end to end with a tiny N on
// the test services (go run ./cmd/sluice-bench -suite
// groupcommit,consumer-inbox -messages 5 -rounds 1), so that a change that
// breaks them fails here rather than in the next make bench.
func TestGroupCommitSuitesRun(t *testing.T) {
	t.Parallel()
	o := Options{PostgresURL: testenv.PostgresURL, AMQPURL: testenv.AMQPURL, Messages: 5, Rounds: 1}
	var out bytes.Buffer
	o.Out = &out
	require.NoError(t, GroupCommit(t.Context(), o))
	require.NoError(t, ConsumerInbox(t.Context(), o))
	for _, want := range []string{"P8: group commit", "batch 32, 2ms", "P8's ceiling", "batches of 16", "P8: latency from publish to commit", "added p99", "P4, re-scoped", "handled ÷ all healthy"} {
		require.Contains(t, out.String(), want)
	}
}
