package console

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// Every replay run is audited, one whose start failed (no broker here)
// too. Before, a start that failed ended the run unaudited. (The audit
// line is also written before the run says it ended — before, a replay
// that ran ended its run first: cmd/sluice's
// TestConsoleRedirectsAReplayToAnotherConsumerQueue read an empty audit
// log after the run page said Done., in 1 of 2 loaded runs at dcb3958.)
func TestEveryReplayRunIsAudited(t *testing.T) {
	t.Parallel()
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	c, err := New(Config{Dial: func() (*amqp.Connection, error) { return nil, fmt.Errorf("no broker here") }, AuditFile: audit,
		Queues: []Queue{{Name: "orders", Poison: "orders.poison"}}, CallTimeout: time.Second, SampleInterval: -1})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()

	ru := c.newRun("replay", "run-1", "orders.poison", "g1", "ops@example.com")
	c.runReplay(ru, c.cfg.Queues[0], "g1", "ops@example.com", loopPlan{sizes: []int{1}, canary: true, wait: time.Second})

	v := ru.view()
	require.True(t, v.Done, "the run ended")
	require.Contains(t, v.Err, "no broker here")
	rows, err := readAudit(audit)
	require.NoError(t, err)
	require.Len(t, rows, 1, "the run's line in the audit log")
	require.Equal(t, "console replay", rows[0].Command)
	require.Equal(t, "error", rows[0].Outcome)
	require.Contains(t, rows[0].Error, "no broker here")
	require.Equal(t, "ops@example.com", rows[0].Operator)
}
