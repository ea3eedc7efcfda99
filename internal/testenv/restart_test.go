package testenv_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// fakeCtl answers rabbitmqctl as a node would: start_app refuses with each
// of refusals in turn, then boots. It injects RabbitMQ 4.0's refusal to
// boot, a race (testenv.StartApp) a test cannot bring about on demand.
type fakeCtl struct {
	refusals []string
	calls    []string
}

func (f *fakeCtl) ctl(_ context.Context, args ...string) (string, error) {
	f.calls = append(f.calls, strings.Join(args, " "))
	switch args[0] {
	case "start_app":
		if len(f.refusals) > 0 {
			out := f.refusals[0]
			f.refusals = f.refusals[1:]
			return out, errors.New("exit status 69: " + out)
		}
	case "-q": // rabbit:log_locations(): this fake has no log
		return "", errors.New("no such node")
	}
	return "", nil
}

const refusal = `Error: {:rabbit, {{:failed_to_deny_deprecated_features, [:transient_nonexcl_queues]}, {:rabbit, :start, [:normal, []]}}}`

// StartApp starts again a node that RabbitMQ 4.0 refused to boot with
// failed_to_deny_deprecated_features, and says so; any other failure ends
// it at once, with the node's log (here: why there is none).
func TestStartAppRetriesOnlyRabbitMQ40sRefusal(t *testing.T) {
	t.Parallel()
	testenv.SetStartAppPause(time.Millisecond) // this test's alone
	f := &fakeCtl{refusals: []string{refusal, refusal}}
	boot, err := testenv.StartApp(t.Context(), f.ctl, "")
	require.NoError(t, err)
	require.Equal(t, 3, boot.Attempts)
	require.Len(t, boot.Refused, 2)
	require.Equal(t, []string{"start_app", "start_app", "start_app", "await_startup"}, f.calls)
	require.Contains(t, boot.String(), "booted on attempt 3")

	f = &fakeCtl{refusals: []string{"Error: {:rabbit, {:bad_config, ...}}"}}
	boot, err = testenv.StartApp(t.Context(), f.ctl, "")
	require.Error(t, err)
	require.Equal(t, 1, boot.Attempts, "another failure is not retried")
	require.Contains(t, err.Error(), "bad_config")
	require.Contains(t, err.Error(), "the node did not name its log")

	f = &fakeCtl{refusals: []string{refusal, refusal, refusal, refusal, refusal, refusal, refusal}}
	boot, err = testenv.StartApp(t.Context(), f.ctl, "")
	require.Error(t, err, "a node that keeps refusing is reported, not retried for ever")
	require.Equal(t, 6, boot.Attempts)
}

// RestartApp restarts a real node (a private one: the shared brokers are
// never restarted by go test) and it serves again; NodeLog reads the log
// the node names.
func TestRestartAppOnAPrivateNode(t *testing.T) {
	t.Parallel()
	node := testenv.StartPrivateRabbitMQ(t)
	r, err := testenv.RestartApp(t.Context(), node.NodeCtl(), testenv.RabbitMQRoot, 100*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, r.Attempts, "%s", r.Boot)
	require.GreaterOrEqual(t, r.Took, r.Down)
	out, err := node.NodeCtl()(t.Context(), "-q", "eval", "rabbit:is_running().")
	require.NoError(t, err)
	require.Equal(t, "true", strings.TrimSpace(out))
	out, err = node.NodeCtl()(t.Context(), "-q", "eval", dlxConfirmTimeout)
	require.NoError(t, err)
	require.Equal(t, wantDLXConfirmTimeout(), strings.TrimSpace(out), "a private node keeps the suite's dead-letter confirm timeout through a restart")
	log := testenv.NodeLog(t.Context(), node.NodeCtl(), testenv.RabbitMQRoot)
	require.False(t, strings.HasPrefix(log, "("), "the node's log is read: %s", log)
}
