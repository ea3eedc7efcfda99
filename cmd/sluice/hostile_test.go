package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// hostile holds what a terminal acts on: an OSC that sets the window title,
// a CSI that clears the screen, a C1 CSI (U+009B), a bidi override and an
// isolate, a forged line, DEL.
const hostile = "\x1b]0;OWNED\x07\x1b[2J \u009b31m \u202eevil\u202c \u2066x\u2069 \r\nsluice: all done\x7f"

// requireNoRawControl fails when s holds a character a terminal acts on,
// newlines and tabs aside.
func requireNoRawControl(t *testing.T, what, s string) {
	t.Helper()
	for _, r := range s {
		if r != '\n' && r != '\t' && control(r) {
			require.Failf(t, "a raw control character reached the operator", "%s printed %U in %q", what, r, s)
		}
	}
}

// A poisoned message whose headers, key, reason and target (a forged
// sluice_poison_queue) carry escape sequences, through every command that
// prints them — stats and inspect as tables and JSON, replay's and
// restore's error paths (the target named in the error line), a dry run,
// the audit log: nothing the operator sees holds a raw control character,
// and the JSON decodes to the message's exact contents (issue 18, item 9).
func TestHostileTextNeverReachesTheOperator(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	target := "orders" + hostile
	ch := testenv.Channel(t, testenv.AMQP(t))
	require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", b.topo.Config().PoisonQueue, false, false, amqp.Publishing{
		Headers: amqp.Table{
			sluice.EventIDKey: "evt-" + hostile, sluice.EventTypeKey: "type-" + hostile,
			metakeys.PoisonClass: "poison", metakeys.PoisonReason: "bad order " + hostile, metakeys.PoisonQueue: target,
			metakeys.PoisonConsumer: "inventory" + hostile, "note": "v" + hostile,
		},
		Body: []byte(`{"note":"` + hostile + `"}`),
	}))
	q := b.topo.Config().PoisonQueue
	check := func(args ...string) (int, string, string) {
		t.Helper()
		code, out, errOut := b.cli(t, args...)
		requireNoRawControl(t, strings.Join(args, " ")+" (stdout)", out)
		requireNoRawControl(t, strings.Join(args, " ")+" (stderr)", errOut)
		return code, out, errOut
	}

	for _, args := range [][]string{{"dlq", "stats", "--queue", q}, {"dlq", "inspect", "--queue", q}} {
		code, out, errOut := check(args...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, `\x1b]0;OWNED\x07\x1b[2J`, "%v: escaped, not dropped", args)
		require.Contains(t, out, `\u202eevil`)
	}
	code, out, errOut := check("dlq", "stats", "--queue", q, "--json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `\u202eevil`)
	require.Contains(t, out, `\u009b31m`)
	var s dlq.Stats
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.Equal(t, 1, s.ByEventType["type-"+hostile], "the JSON decodes to the exact contents")

	code, out, errOut = check("dlq", "inspect", "--queue", q, "--json")
	require.Equal(t, 0, code, errOut)
	var rec struct {
		Metadata map[string]string `json:"metadata"`
		Payload  string            `json:"payload"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Equal(t, "evt-"+hostile, rec.Metadata[sluice.EventIDKey])
	require.Equal(t, "v"+hostile, rec.Metadata["note"])
	require.Equal(t, `{"note":"`+hostile+`"}`, rec.Payload)

	// The forged target is not of the poison queue's family: the dry run
	// and the replay refuse it, naming it escaped; redirected there with
	// --to, it does not exist, and the publish fails naming it, escaped.
	code, _, errOut = check("dlq", "replay", "--queue", q, "--dry-run")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `its sluice_poison_queue names "orders\x1b]0;OWNED`)
	code, _, errOut = check("dlq", "replay", "--queue", q)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `its sluice_poison_queue names "orders\x1b]0;OWNED\x07\x1b[2J`)
	code, _, errOut = check("dlq", "replay", "--queue", q, "--to", target)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `dlq: replaying to orders\x1b]0;OWNED\x07\x1b[2J`)
	require.Equal(t, 1, testenv.QueueDepth(t, testenv.AMQP(t), q), "the message stays")

	// A tampered archive: its record names the hostile target, and is
	// refused (its digest); restored --to the hostile target, the dry run
	// and the failed publish name it, escaped.
	archive := filepath.Join(t.TempDir(), "archive.jsonl")
	code, _, errOut = check("dlq", "archive", "--queue", q, "--to", archive)
	require.Equal(t, 0, code, errOut)
	orig, err := os.ReadFile(archive)
	require.NoError(t, err)
	requireNoRawControl(t, "the archive file", string(orig))
	var line map[string]any
	require.NoError(t, json.Unmarshal(orig, &line))
	line["queue"] = target
	raw, err := json.Marshal(line)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(archive, append(raw, '\n'), 0o600))
	code, _, errOut = check("dlq", "restore", "--from", archive)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "line 1: the record's digest does not match its contents")
	require.NoError(t, os.WriteFile(archive, orig, 0o600))
	code, out, errOut = check("dlq", "restore", "--from", archive, "--to", target, "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `orders\x1b]0;OWNED`)
	code, _, errOut = check("dlq", "restore", "--from", archive, "--to", target)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `to orders\x1b]0;OWNED\x07\x1b[2J`)

	auditLog, err := os.ReadFile(b.audit)
	require.NoError(t, err)
	requireNoRawControl(t, "the audit log", string(auditLog))
	require.Len(t, b.auditLines(t), 7, "replay (dry run, run, --to), archive, restore (refused, dry run, run)")
}

// The stack's own log lines — poisoned, parked in a tier, exhausted,
// rejected — through Watermill's StdLoggerAdapter, for messages whose event
// id and handler error carry escape sequences: no raw control character, one
// line per entry (issue 18, item 9).
func TestStackLogsEscapeMessageContents(t *testing.T) {
	t.Parallel()
	var buf testenv.SyncBuffer
	logger := watermill.NewStdLoggerWithOut(&buf, false, false)
	e, err := embedded.New(embedded.Config{Topic: "orders", TierDelays: []time.Duration{time.Millisecond}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	require.NoError(t, err)
	var mu sync.Mutex
	seen := map[string]int{}
	_, err = router.Add(r, router.HandlerConfig{
		Broker: e, Name: "inventory",
		Handler: func(msg *message.Message) error {
			id := msg.Metadata.Get(sluice.EventIDKey)
			mu.Lock()
			seen[id]++
			n := seen[id]
			mu.Unlock()
			switch {
			case strings.HasPrefix(id, "poison"):
				return sluice.Poison(errors.New("unknown field " + id))
			case strings.HasPrefix(id, "reject"):
				return sluice.Reject(errors.New("out of stock: " + id))
			case strings.HasPrefix(id, "retry") && n == 1:
				return sluice.Transient(errors.New("stock service: " + id))
			case strings.HasPrefix(id, "exhaust"):
				return sluice.Transient(errors.New("always down: " + id))
			}
			return nil
		},
		Stages: router.Stages{
			Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{},
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	for _, id := range []string{"poison", "reject", "retry", "exhaust"} {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, id+hostile)
		require.NoError(t, e.PubSub().Publish("orders", m))
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(e.Poisoned()) == 2 && seen["retry"+hostile] == 2 && seen["reject"+hostile] == 1
	}, time.Minute, 5*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, e.Close())

	out := buf.String()
	requireNoRawControl(t, "the stack's log", out)
	for _, want := range []string{"Delivery isolated in the poison queue", "Delivery rejected", "Delivery parked in a retry tier", "Retry budget spent"} {
		require.Contains(t, out, want)
	}
	require.Contains(t, out, `poison\x1b]0;OWNED\x07\x1b[2J`)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		require.NotContains(t, line, "sluice: all done\x7f", "no forged line")
		require.True(t, strings.HasPrefix(strings.TrimSpace(line), "level=") || strings.Contains(line, "level="), "one entry a line: %q", line)
	}
}

// control is what a terminal acts on: C0, DEL, C1, the line separators
// and the bidirectional controls (as diag.Control, written out here so the
// test stands on its own).
func control(r rune) bool {
	return r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f || r == 0x061c || r == 0x200e || r == 0x200f ||
		r == 0x2028 || r == 0x2029 || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}
