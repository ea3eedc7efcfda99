package bench

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The scaleout suite runs end to end with a tiny N on the test services,
// its consumer processes being this test binary (TestMain), so that a
// change that breaks it fails here rather than in the next make bench.
func TestScaleOutSuiteRuns(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	o := Options{PostgresURL: testenv.PostgresURL, AMQPURL: testenv.AMQPURL, Messages: 25, Rounds: 1}
	var out bytes.Buffer
	o.Out = &out
	// 4 connections a process: the test shares PostgreSQL with the others.
	require.NoError(t, scaleOut(t.Context(), o, self, []int{1, 2}, 1, 4))
	for _, want := range []string{"scale-out: consumer processes", "full stack ÷ 1 process", "÷ PG ceiling"} {
		require.Contains(t, out.String(), want)
	}
	require.Regexp(t, `(?m)^\s+2\s+32\s+\d+\s+\d+\s+\d+\s`, out.String(), "a row for 2 processes, 32 in flight")
}
