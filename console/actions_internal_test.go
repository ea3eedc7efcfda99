package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
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
// dcb3958.) The line of a discard or an archive whose start failed names
// what the operator asked — the reason, the limit — as a run's that began
// does; before, it had neither (an operator's "discard 5, duplicates of
// INC-7" audited as a discard of all, for no reason).
func TestEveryRunIsAudited(t *testing.T) {
	t.Parallel()
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	c, err := New(Config{Dial: func() (*amqp.Connection, error) { return nil, fmt.Errorf("no broker here") }, AuditFile: audit,
		Queues: []Queue{{Name: "orders", Poison: "orders.poison"}}, CallTimeout: time.Second, SampleInterval: -1,
		Archive: func() (dlq.ArchiveSink, error) { return nil, fmt.Errorf("no sink: the broker is dialled first") }})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()

	replay := c.newRun("replay", "run-1", "orders.poison", "g1", "ops@example.com")
	c.runReplay(replay, c.cfg.Queues[0], "g1", "ops@example.com", loopPlan{sizes: []int{1}, canary: true, wait: time.Second})
	for _, tc := range []struct{ verb, group string }{{"discard", "g2"}, {"archive", "g3"}} {
		form := url.Values{"confirm": {"yes"}, "reason": {"duplicates of INC-7"}, "limit": {"5"}}
		r := httptest.NewRequest(http.MethodPost, "/q/orders.poison/g/"+tc.group+"/"+tc.verb, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.SetPathValue("queue", "orders.poison")
		r.SetPathValue("group", tc.group)
		w := httptest.NewRecorder()
		map[string]http.HandlerFunc{"discard": c.discard, "archive": c.archive}[tc.verb](w, r)
		require.Equal(t, http.StatusBadGateway, w.Code, "no broker: the %s does not start", tc.verb)
	}

	c.mu.Lock()
	runs := make([]*run, 0, len(c.runs))
	for _, ru := range c.runs {
		runs = append(runs, ru)
	}
	c.mu.Unlock()
	require.Len(t, runs, 3)
	for _, ru := range runs {
		v := ru.view()
		require.True(t, v.Done, "the %s run ended", ru.Kind)
		require.Contains(t, v.Err, "no broker here")
	}
	rows, err := readAudit(audit)
	require.NoError(t, err)
	require.Len(t, rows, 3, "each run's line in the audit log")
	for i, command := range []string{"console archive", "console discard", "console replay"} { // newest first
		require.Equal(t, command, rows[i].Command)
		require.Equal(t, "error", rows[i].Outcome)
		require.Contains(t, rows[i].Error, "no broker here")
		require.Equal(t, "orders.poison", rows[i].Queue)
	}
	require.Equal(t, "duplicates of INC-7", rows[1].Reason, "the discard's reason")
	raw, err := os.ReadFile(audit)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Len(t, lines, 3)
	for _, line := range lines[1:] { // oldest first: the discard's, the archive's
		var rec dlq.AuditRecord
		require.NoError(t, rec.UnmarshalJSON([]byte(line)))
		require.Equal(t, "5", rec.Options["limit"], "%s: the limit asked", rec.Command)
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
