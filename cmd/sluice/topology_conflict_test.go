package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// `topology apply --quorum` on an existing classic queue prints the
// library's error as it is: the argument it names is no secret. Before,
// "… other arguments pass: x-queue-type cannot be set by a policy" came
// out as "… pass: xxxxx cannot be set by a policy" — the redaction took
// the word "pass" for a key and the argument's name for its value.
func TestTopologyConflictNamesTheArgument(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("conflict")
	testenv.DeleteQueuesNowAndAtEnd(t, queue, queue+".retry.30s", queue+".retry.5m", queue+".retry.30m", queue+".poison")
	_, err := testenv.Channel(t, testenv.AMQP(t)).QueueDeclare(queue, true, false, false, false, nil) // classic
	require.NoError(t, err)
	var out, errOut bytes.Buffer
	code := run([]string{"--amqp-url", testenv.AMQPURL, "topology", "apply", "--queue", queue, "--quorum"}, &out, &errOut)
	require.Equal(t, 1, code, errOut.String())
	require.Contains(t, errOut.String(), "x-queue-type cannot be set by a policy")
	require.NotContains(t, errOut.String(), "xxxxx")
}
