package bench

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The batchhandler suite runs end to end with a tiny N on the test services
// (go run ./cmd/sluice-bench -suite batchhandler -messages 5 -rounds 1), so
// that a change that breaks it fails here rather than in the next run.
func TestBatchHandlerSuiteRuns(t *testing.T) {
	t.Parallel()
	o := Options{PostgresURL: testenv.PostgresURL, AMQPURL: testenv.AMQPURL, Messages: 5, Rounds: 1}
	var out bytes.Buffer
	o.Out = &out
	require.NoError(t, BatchHandlers(t.Context(), o))
	for _, want := range []string{"B1: batch handlers", "batch handler, MaxBatch prefetch/2 (32)", "10% poison", "B1's ceiling", "batches of 64", "÷ no-op consume", "CPU µs/msg", "B1's CPU bound", "B1's bound in turns"} {
		require.Contains(t, out.String(), want)
	}
}
