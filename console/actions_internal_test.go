package console

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// Every run of the console is audited, one whose start failed (no broker
// here) too. Before, a replay's failed start ended its run unaudited, and
// so did a discard's or an archive's that found no broker or the queue
// held past CallTimeout. (The audit line is also written before the run
// says it ended — before, a replay that ran ended its run first:
// cmd/sluice's TestConsoleRedirectsAReplayToAnotherConsumerQueue read an
// empty audit log after the run page said Done., in 1 of 2 loaded runs at
// dcb3958.)
func TestEveryRunIsAudited(t *testing.T) {
	t.Parallel()
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	c, err := New(Config{Dial: func() (*amqp.Connection, error) { return nil, fmt.Errorf("no broker here") }, AuditFile: audit,
		Queues: []Queue{{Name: "orders", Poison: "orders.poison"}}, CallTimeout: time.Second, SampleInterval: -1})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()

	replay := c.newRun("replay", "run-1", "orders.poison", "g1", "ops@example.com")
	c.runReplay(replay, c.cfg.Queues[0], "g1", "ops@example.com", loopPlan{sizes: []int{1}, canary: true, wait: time.Second})
	w := httptest.NewRecorder()
	a, ok := c.startAction(w, httptest.NewRequest(http.MethodPost, "/q/orders.poison/g/g2/discard", nil), "discard", "orders.poison")
	require.False(t, ok, "no broker: the discard does not start")
	require.Equal(t, http.StatusBadGateway, w.Code)

	for _, ru := range []*run{replay, a.run} {
		v := ru.view()
		require.True(t, v.Done, "the %s run ended", ru.Kind)
		require.Contains(t, v.Err, "no broker here")
	}
	rows, err := readAudit(audit)
	require.NoError(t, err)
	require.Len(t, rows, 2, "each run's line in the audit log")
	for i, command := range []string{"console discard", "console replay"} { // newest first
		require.Equal(t, command, rows[i].Command)
		require.Equal(t, "error", rows[i].Outcome)
		require.Contains(t, rows[i].Error, "no broker here")
		require.Equal(t, "orders.poison", rows[i].Queue)
	}
}
