package bench

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// The putback suite runs end to end with a few messages on the test
// broker, and every way of putting back keeps the order.
func TestPutBackSuiteRuns(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, PutBack(t.Context(), Options{AMQPURL: testenv.AMQPURL, Messages: 10, Rounds: 1, Out: &out}))
	require.Contains(t, out.String(), "putback: a dlq.Queue.Each of 200 messages, every one put back")
	require.Regexp(t, `(?m)^\s*plain classic \(channel close\)\s+[0-9.]+ s\s+\d+\s+true\s*$`, out.String())
	require.Regexp(t, `(?m)^\s*classic with x-max-length \(a nack each\)\s+[0-9.]+ s\s+\d+\s+true\s*$`, out.String())
	require.Regexp(t, `(?m)^\s*quorum \(a nack each, 8 at a time\)\s+[0-9.]+ s\s+\d+\s+true\s*$`, out.String())
}
