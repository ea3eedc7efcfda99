package testenv_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicemq/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Rabbitmqctl manages the broker the tests connect to (SLUICE_TEST_AMQP_URL),
// not whichever rabbitmqctl is on the PATH: a queue declared through the
// URL is listed by it, and a policy set through it applies to that queue.
// With make test-rabbitmq4 this is the 4.0 node in its chroot.
func TestRabbitmqctlManagesTheBrokerUnderTest(t *testing.T) {
	t.Parallel()
	ch := testenv.Channel(t, testenv.AMQP(t))
	q := testenv.Name("ctl")
	_, err := ch.QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, q)

	require.Contains(t, strings.Fields(testenv.Rabbitmqctl(t, "-q", "list_queues", "--no-table-headers", "name")), q)
	testenv.Policy(t, "sluice-test-"+q, "^"+q+"$", `{"max-length":7}`, 100)
	require.Eventually(t, func() bool {
		for line := range strings.SplitSeq(testenv.Rabbitmqctl(t, "-q", "list_queues", "--no-table-headers", "name", "policy"), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == q {
				return f[1] == "sluice-test-"+q
			}
		}
		return false
	}, 2*time.Minute, 200*time.Millisecond, "the policy applies to the queue on the broker under test") // a liveness bound: each rabbitmqctl starts an Erlang VM, seconds on a loaded machine
	t.Logf("RabbitMQ %s", testenv.RabbitMQVersion(t))
}

const dlxConfirmTimeout = "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout)."

func wantDLXConfirmTimeout() string {
	return fmt.Sprintf("{ok,%d}", testenv.DeadLetterConfirmTimeout.Milliseconds())
}

// The broker under test (the shared 3.10 broker, or the 4.0 node) sends
// again a quorum queue's dead-lettered copy a restarting broker refused
// after the suite's 10 s, not RabbitMQ's 180 s: make services set it
// (scripts/services.sh, scripts/rabbitmq4.sh), and with the default the
// scenarios restarting a broker on quorum queues took 3 minutes whenever
// the wait fell.
func TestTheBrokerUnderTestHasTheSuitesDeadLetterConfirmTimeout(t *testing.T) {
	t.Parallel()
	require.Equal(t, wantDLXConfirmTimeout(), strings.TrimSpace(testenv.Rabbitmqctl(t, "-q", "eval", dlxConfirmTimeout)),
		"make services sets it; a broker started before it is restarted by make services")
}
