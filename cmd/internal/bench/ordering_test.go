package bench

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The ordering suite runs end to end with a tiny N on the test services
// (go run ./cmd/sluice-bench -suite ordering -messages 25 -rounds 1), so
// that a change that breaks it fails here rather than in the next make
// bench.
func TestOrderingSuiteRuns(t *testing.T) {
	t.Parallel()
	o := Options{PostgresURL: testenv.PostgresURL, AMQPURL: testenv.AMQPURL, Messages: 25, Rounds: 1}
	var out bytes.Buffer
	o.Out = &out
	require.NoError(t, Ordering(t.Context(), o))
	for _, want := range []string{"P9: order per key", "ordered ÷ unordered", "one blocked ÷ none", "1%", "10%", "Waits ops/s", "key lock ops/s"} {
		require.Contains(t, out.String(), want)
	}
	require.Regexp(t, `(?m)^\s*10%\s+\d+\s+\d+\s+\d+\.\d\d`, out.String(), "a row for the blocked key at 10% of the load")
}
