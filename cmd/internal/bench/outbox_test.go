package bench

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The outbox suite runs end to end with a tiny N, on the test services
// (what `go run ./cmd/sluice-bench -suite outbox -messages 5 -rounds 1`
// prints): the quick mode, so that a change that breaks the suite fails
// here rather than in the next make bench.
func TestOutboxSuiteRuns(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := Outbox(t.Context(), Options{PostgresURL: testenv.PostgresURL, AMQPURL: testenv.AMQPURL, Messages: 5, Rounds: 1, Out: &out})
	require.NoError(t, err)
	for _, want := range []string{"sluice relay, BatchSize 100", "watermill-sql + forwarder", "one produced per delivery", "commit → confirm p50", "The outbox's ceiling", "drained as a relay does"} {
		require.Contains(t, out.String(), want)
	}
}
