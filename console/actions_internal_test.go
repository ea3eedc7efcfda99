package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/replay/ledger"
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

// outboxSpy counts the retries the console asked of it.
type outboxSpy struct {
	Outbox
	retries atomic.Int64
}

func (o *outboxSpy) RetryNow(context.Context) (int64, error) { o.retries.Add(1); return 0, nil }

// An action the audit log cannot record is not begun: a replay, a discard
// and an outbox retry are refused before the console dials the broker or
// asks the outbox anything, and no run is made. A run whose line could not
// be written at its end (the disk filled, the file rotated away after the
// check) says so. Before, the console acted and dropped the audit log's
// error: the run page said Done. and no line was written.
func TestAnActionTheAuditLogCannotRecordIsNotBegun(t *testing.T) {
	t.Parallel()
	audit := filepath.Join(t.TempDir(), "gone", "audit.jsonl") // its directory does not exist
	var dials atomic.Int64
	spy := &outboxSpy{}
	c, err := New(Config{Dial: func() (*amqp.Connection, error) { dials.Add(1); return nil, fmt.Errorf("no broker here") }, AuditFile: audit,
		Queues: []Queue{{Name: "orders", Poison: "orders.poison"}}, Outboxes: map[string]Outbox{"orders": spy},
		// Replay is offered with a publisher and outcome records; either, touched, would panic.
		Publisher: struct{ dlq.Publisher }{}, Outcomes: struct{ ledger.Ledger }{},
		CallTimeout: time.Second, SampleInterval: -1})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()

	form := url.Values{"confirm": {"yes"}, "reason": {"a test"}, "canary": {"1"}}
	for _, tc := range []struct {
		path    string
		handler http.HandlerFunc
		values  map[string]string
	}{
		{"/q/orders.poison/g/g1/replay", c.replay, map[string]string{"queue": "orders.poison", "group": "g1"}},
		{"/q/orders.poison/g/g1/discard", c.discard, map[string]string{"queue": "orders.poison", "group": "g1"}},
		{"/outbox/orders/retry", c.outboxRetry, map[string]string{"name": "orders"}},
	} {
		r := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range tc.values {
			r.SetPathValue(k, v)
		}
		w := httptest.NewRecorder()
		tc.handler(w, r)
		require.Equal(t, http.StatusInternalServerError, w.Code, "%s: refused", tc.path)
		require.Contains(t, w.Body.String(), "the audit log cannot be written, nothing was moved", tc.path)
	}
	require.Zero(t, dials.Load(), "no broker dialled")
	require.Zero(t, spy.retries.Load(), "no outbox retried")
	c.mu.Lock()
	runs := len(c.runs)
	c.mu.Unlock()
	require.Zero(t, runs, "no run made")

	ru := c.newRun("discard", "run-1", "orders.poison", "g1", "ops@example.com")
	c.end(ru, "ops@example.com", nil, dlq.Result{Replayed: 3}, nil, "a test", []string{"a", "b", "c"})
	v := ru.view()
	require.True(t, v.Done)
	require.Contains(t, v.Err, "not in the audit log", "the run says its line is missing")
}
