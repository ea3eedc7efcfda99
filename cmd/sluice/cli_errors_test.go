package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/testenv"
)

// The management API unreachable (the plugin off: connection refused) is
// said so, with the URL's password replaced; before: "not a valid URL".
func TestQueuesSaysTheManagementAPIIsUnreachable(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	code := run([]string{"--amqp-url", testenv.AMQPURL, "queues", "--management-url", "http://admin:s3cret@127.0.0.1:1"}, &out, &errOut)
	require.Equal(t, 1, code)
	msg := errOut.String()
	require.Contains(t, msg, "cannot reach the management API at http://admin:xxxxx@127.0.0.1:1: ")
	require.Contains(t, msg, "connection refused; is the rabbitmq_management plugin enabled")
	require.NotContains(t, msg, "s3cret")
	require.NotContains(t, msg, "not a valid URL")
}

// An --outcomes URL of a scheme the CLI cannot read is a usage error that
// names the schemes it can, before anything moves (before: lib/pq's raw
// error, exit 1; a discard removed the messages first).
func TestOutcomesOfAnUnsupportedScheme(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	for _, args := range [][]string{
		{"dlq", "report"},
		{"dlq", "resolve", "--run", "r", "--event", "e1", "--reason", "fixed"},
		{"dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--canary", "1"},
		{"dlq", "discard", "--queue", b.topo.Config().PoisonQueue, "--reason", "test data"},
		{"dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to", filepath.Join(t.TempDir(), "a.jsonl")},
	} {
		code, _, errOut := b.cli(t, append(args, "--outcomes", "mysql://app:s3cret@db:3306/app")...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, `--outcomes: scheme "mysql" is not supported: want postgres://`, args)
		require.Contains(t, errOut, "redis://", args)
		require.NotContains(t, errOut, "s3cret")
	}
	require.Len(t, peekIDs(t, b.topo.Config().PoisonQueue), 6, "nothing moved")
}

// A usage error points to the subcommand's help, not the root's.
func TestUsageErrorsNameTheSubcommandsHelp(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{
		"dlq replay --queue q --rate fast": "Run 'sluice dlq replay --help' for usage.",
		"dlq stats --nope":                 "Run 'sluice dlq stats --help' for usage.",
		"topology plan":                    "Run 'sluice topology plan --help' for usage.",
		"dlq replya":                       "Run 'sluice dlq --help' for usage.",
	} {
		var out, errOut bytes.Buffer
		code := run(strings.Fields(args), &out, &errOut)
		require.Equal(t, 2, code, args)
		require.Contains(t, errOut.String(), want, args)
	}
}

// The discard audit line counts what it did as "discarded" (before:
// "replayed": 2).
func TestDiscardAuditCountsDiscarded(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	code, _, errOut := b.cli(t, "dlq", "discard", "--queue", b.topo.Config().PoisonQueue, "--class", "poison", "--reason", "test data")
	require.Equal(t, 0, code, errOut)
	raw, err := os.ReadFile(b.audit)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"discarded":2`)
	require.NotContains(t, string(raw), `"replayed"`)
	recs := b.auditLines(t)
	require.Equal(t, 2, recs[0].Result.Replayed, "read back into the record's count")
}

// Not parallel: it unsets $USER. Without $SLUICE_OPERATOR and $USER (a
// container) the operator is the OS user, not "unknown" (before); a command
// that moves messages refuses to run with no operator at all, before it
// touches anything (before: it ran as "").
func TestOperatorIsTheOSUserAndRequired(t *testing.T) {
	t.Setenv("USER", "")
	t.Setenv("SLUICE_OPERATOR", "")
	me, err := user.Current()
	require.NoError(t, err)
	b := newBed(t)
	b.poisoned(t, "e1", "order.created", sluice.Poison(os.ErrInvalid))
	var out, errOut bytes.Buffer
	code := run([]string{"--amqp-url", testenv.AMQPURL, "--audit", b.audit, "dlq", "replay", "--queue", b.topo.Config().PoisonQueue, "--dry-run"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	recs := b.auditLines(t)
	require.Equal(t, me.Username, recs[0].Operator)
	require.NotEqual(t, "unknown", recs[0].Operator)

	noAudit := filepath.Join(t.TempDir(), "audit.jsonl")
	code = run([]string{"--amqp-url", testenv.AMQPURL, "--audit", noAudit, "--operator", " ", "dlq", "discard", "--queue", b.topo.Config().PoisonQueue, "--reason", "x"}, &out, &errOut)
	require.Equal(t, 2, code)
	require.Contains(t, errOut.String(), "--operator is required")
	require.NoFileExists(t, noAudit)
	require.Equal(t, []string{"e1"}, peekIDs(t, b.topo.Config().PoisonQueue))
}

// dlq's errors name no flag (the console shows them too); the CLI adds
// the flags that act on each, wrapped so errors.Is still matches, and
// leaves any other error, and no error, as they are.
func TestDLQErrorsGetTheirFlagsFromTheCLI(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		flag string
	}{
		{fmt.Errorf("%w: event e1: no sluice_poison_queue", dlq.ErrNoTarget), "(use --to)"},
		{fmt.Errorf("%w: event e1", dlq.ErrTargetRefused), "--target names the queues"},
		{fmt.Errorf("%w: message at position 3", dlq.ErrUnreadable), "(--unreadable selects them)"},
		{fmt.Errorf("dlq: f line 2: %w: the record has no queue to restore it to", dlq.ErrOutsideFamily), "(use --to to restore elsewhere)"},
		{fmt.Errorf("dlq: f line 2: %w: it has none", dlq.ErrDigest), "--accept-undigested"},
		{fmt.Errorf("dlq: f line 2: %w", dlq.ErrRecordSignature), "--signing-key-file"},
	} {
		got := flagHints(c.err)
		require.ErrorIs(t, got, c.err)
		require.Equal(t, c.err.Error()+" ", got.Error()[:len(c.err.Error())+1])
		require.Contains(t, got.Error(), c.flag)
	}
	other := errors.New("dlq: reading q: closed")
	require.Equal(t, other, flagHints(other))
	require.NoError(t, flagHints(nil))
}
