package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/localenv"
)

// The RabbitMQ under test: AMQPURL, managed with the rabbitmqctl of the
// installation it runs from. By default that is the machine's (rabbitmqctl
// on the PATH, its default node). For the RabbitMQ 4.0 node of
// scripts/rabbitmq4.sh, which runs from a Debian 13 directory with chroot,
// `scripts/rabbitmq4.sh env` prints the three variables:
//
//	SLUICE_TEST_AMQP_URL        the node's AMQP URL
//	SLUICE_TEST_RABBITMQ_ROOT   the directory its RabbitMQ runs from (chroot)
//	SLUICE_TEST_RABBITMQ_NODE   its Erlang node name, for rabbitmqctl -n
//
// Tests that set a policy on, stop or restart the broker under test do it
// through Rabbitmqctl, and private nodes and clusters run from the same
// installation: a test never manages a broker other than the one it tests.
var (
	RabbitMQRoot = localenv.Get("SLUICE_TEST_RABBITMQ_ROOT", "")
	RabbitMQNode = localenv.Get("SLUICE_TEST_RABBITMQ_NODE", "")
)

// chrootHome is HOME for RabbitMQ's commands in RabbitMQRoot: where the
// Erlang cookie that scripts/rabbitmq4.sh's node and its rabbitmqctl share
// lives (they run as root there). Private nodes run from the directory use
// it too.
const chrootHome = "/var/lib/sluice-rmq4"

// rabbitmqBin is where RabbitMQ's commands are in RabbitMQRoot.
const rabbitmqBin = "/usr/lib/rabbitmq/bin"

// rabbitmqCommand returns the command that runs one of RabbitMQ's tools
// (rabbitmqctl, rabbitmq-server) of the installation under test, with env
// added to its environment.
func rabbitmqCommand(ctx context.Context, env []string, tool string, args ...string) *exec.Cmd {
	if RabbitMQRoot == "" {
		cmd := exec.CommandContext(ctx, tool, args...)
		if len(env) > 0 {
			cmd.Env = append(cmd.Environ(), env...)
		}
		return cmd
	}
	argv := append([]string{RabbitMQRoot, "/usr/bin/env", "-i",
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + chrootHome, "LANG=C.UTF-8"}, env...)
	argv = append(argv, path.Join(rabbitmqBin, tool))
	return exec.CommandContext(ctx, "chroot", append(argv, args...)...)
}

// ctlArgs adds node's -n to rabbitmqctl's args (none for the default node).
func ctlArgs(node string, args []string) []string {
	if node == "" {
		return args
	}
	return append([]string{"-n", node}, args...)
}

// TryRabbitmqctl runs rabbitmqctl args against the broker under test
// (RabbitMQRoot's rabbitmqctl, node RabbitMQNode) and returns its output,
// or its error with the output.
func TryRabbitmqctl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := rabbitmqCommand(ctx, nil, "rabbitmqctl", ctlArgs(RabbitMQNode, args)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Rabbitmqctl runs rabbitmqctl args against the broker under test and
// returns its output; t fails if it fails.
func Rabbitmqctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := TryRabbitmqctl(context.Background(), args...)
	require.NoError(t, err)
	return out
}

// Policy sets the policy name (pattern, definition JSON, applied to queues
// at priority) on the broker under test, and clears it when t ends; the
// returned function clears it sooner (once).
func Policy(t testing.TB, name, pattern, definition string, priority int) (clear func()) {
	t.Helper()
	Rabbitmqctl(t, "set_policy", "--apply-to", "queues", "--priority", fmt.Sprint(priority), name, pattern, definition)
	var once sync.Once
	clear = func() {
		once.Do(func() {
			if _, err := TryRabbitmqctl(context.Background(), "clear_policy", name); err != nil {
				t.Errorf("clearing policy %s: %v", name, err)
			}
		})
	}
	t.Cleanup(clear)
	return clear
}

// RabbitMQVersion returns the version of the broker under test, as its
// rabbitmqctl reports it ("3.10.8", "4.0.5").
func RabbitMQVersion(t testing.TB) string {
	t.Helper()
	out := Rabbitmqctl(t, "-q", "eval", "rabbit_misc:version().")
	return strings.Trim(strings.TrimSpace(out), `"`)
}

// RabbitMQMajor returns the major version of the broker under test (3, 4).
func RabbitMQMajor(t testing.TB) int {
	t.Helper()
	v := RabbitMQVersion(t)
	var major int
	_, err := fmt.Sscanf(v, "%d.", &major)
	require.NoError(t, err, "RabbitMQ version %q", v)
	return major
}
