package bench

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The outbox-memory suite runs end to end with a few rows on the test
// services, its relay processes being this test binary (TestMain).
func TestOutboxMemorySuiteRuns(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	var out bytes.Buffer
	o := Options{PostgresURL: testenv.PostgresURL, AMQPURL: testenv.AMQPURL, Messages: 6, Rounds: 1, Out: &out}
	require.NoError(t, outboxMemory(t.Context(), o, self, 1))
	require.Contains(t, out.String(), "outbox-memory: the relay's peak RSS, 6 rows of 1.5 MB")
	require.Regexp(t, `(?m)^\s*BatchBytes 4 MiB\s+\d+ MB\s+3\.0 MB\s`, out.String(), "batches of at most 4 MiB: 2 rows (3.0 MB)")
	require.Regexp(t, `(?m)^\s*no byte bound \(before\)\s+\d+ MB\s+9\.0 MB\s`, out.String(), "one batch of the 6 rows")
}
