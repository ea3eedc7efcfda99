package bench

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The batchhandler suite runs end to end with a tiny N on the test services
// (go run ./cmd/sluice-bench -suite batchhandler -messages 5 -rounds 1), so
// that a change that breaks it fails here rather than in the next run. Its
// bounds' sections are printed measured or not: with so few deliveries a
// run may end within one of /proc/stat's 10 ms ticks, and the CPU bound had
// no rows — the section was left out, and the test failed by timing (once,
// on an idle machine, in a fresh-clone run at e118f86).
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

// A bound with no rows says so under its title. Before, the section was
// left out: TestBatchHandlerSuiteRuns failed when its runs were too short
// for a CPU sample.
func TestABoundWithoutRowsSaysItWasNotMeasured(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	bound(&out, "B1's CPU bound: …", []string{"in flight"}, nil, "the note")
	require.Contains(t, out.String(), "B1's CPU bound")
	require.Contains(t, out.String(), "not measured")
	require.NotContains(t, out.String(), "the note")
}
