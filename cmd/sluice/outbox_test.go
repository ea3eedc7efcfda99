package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"

	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/sluicesql"
)

// outboxBed is an outbox table in a schema of the test's own.
type outboxBed struct {
	db    *sqlx.DB
	store *sluicesql.Outbox
	table string
}

func newOutboxBed(t *testing.T) *outboxBed {
	t.Helper()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	table := schema + ".sluice_outbox"
	store := testenv.Migrate(t, db, sluicesql.Config{Schema: schema}).Outbox
	return &outboxBed{db: db, store: store, table: table}
}

// write commits messages with these ids to topic, as a producer's
// transaction does.
func (b *outboxBed) write(t *testing.T, topic string, ids ...string) {
	t.Helper()
	tx, err := b.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	msgs := make([]*message.Message, len(ids))
	for i, id := range ids {
		msgs[i] = message.NewMessage(id, []byte(`{}`))
	}
	require.NoError(t, b.store.Write(t.Context(), tx, topic, msgs...))
	require.NoError(t, tx.Commit())
}

// runRelay runs a relay of cfg until the test ends or stop is called.
func runRelay(t *testing.T, store outbox.Store, pub message.Publisher, cfg outbox.RelayConfig) (stop func()) {
	t.Helper()
	relay, err := outbox.NewRelay(store, pub, cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(context.Background()) }()
	stop = sync.OnceFunc(func() {
		require.NoError(t, relay.Close())
		require.NoError(t, <-done)
	})
	t.Cleanup(stop)
	return stop
}

// cli runs the CLI with --db and --table of the bed after args.
func (b *outboxBed) cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"--audit", filepath.Join(t.TempDir(), "audit.jsonl")}, args...)
	code := run(append(args, "--db", testenv.PostgresURL, "--table", b.table), &out, &errOut)
	return code, out.String(), errOut.String()
}

// The on-call's path through a stuck outbox, on a real relay and RabbitMQ:
// rows to a queue that does not exist fail (unroutable) and wait;
// stats counts them, list --failing shows their ids and error, oldest
// first; once the queue is declared, retry makes them due, and a relay
// publishes them at once, leaving the table empty.
func TestOutboxCommandsShowAStuckOutboxAndRetryIt(t *testing.T) {
	t.Parallel()
	b := newOutboxBed(t)
	missing := testenv.Name("outbox-missing")
	testenv.DeleteQueuesAtEnd(t, missing)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	// Each failed row waits two minutes, longer than the test: only retry
	// makes them due again. (Not longer: after a batch that got nothing
	// through, the relay sleeps RetryMin/16, not woken by new rows.)
	cfg := outbox.RelayConfig{PollInterval: 50 * time.Millisecond, RetryMin: 2 * time.Minute, RetryMax: 2 * time.Minute}
	stopRelay := runRelay(t, b.store, pub, cfg)
	b.write(t, missing, "m-1", "m-2", "m-3")
	require.Eventually(t, func() bool {
		rows, err := b.store.List(t.Context(), sluicesql.OutboxFailing, 10)
		refused := 0
		for _, r := range rows {
			if strings.Contains(r.LastError, "unroutable") {
				refused++
			}
		}
		return err == nil && refused == 3
	}, 60*time.Second, 10*time.Millisecond, "each row refused, waiting two minutes (a broker restarting meanwhile: retried)")
	stopRelay()

	code, out, errOut := b.cli(t, "outbox", "stats")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, regexp.QuoteMeta(b.table)+` +│ +3 │ +3 │ +0 │ \d+s \(20`, out)
	code, out, errOut = b.cli(t, "outbox", "stats", "--json")
	require.Equal(t, 0, code, errOut)
	var st outboxStatsJSON
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, b.table, st.Table)
	require.Equal(t, int64(3), st.Pending)
	require.Equal(t, int64(3), st.Failing)
	require.Greater(t, st.OldestAgeSeconds, 0.0)
	require.NotNil(t, st.Oldest)

	code, out, errOut = b.cli(t, "outbox", "list", "--failing")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "unroutable")
	require.Regexp(t, `│ m-1 +│ m-1 +│ +\d │ +\d+s │ in (1m\d+s|2m0s) +│`, out, "the event id is the message id when the producer set none")
	require.Less(t, strings.Index(out, "m-1"), strings.Index(out, "m-3"), "oldest first")
	require.Contains(t, out, "3 failing rows shown, oldest first; "+b.table+" holds 3 pending, 3 failing, 0 dead")
	code, out, errOut = b.cli(t, "outbox", "list", "--limit", "2", "--json")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var row outboxRowJSON
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &row))
	require.Equal(t, "m-1", row.MessageID)
	require.Equal(t, "m-1", row.EventID)
	require.Equal(t, missing, row.Topic)
	require.GreaterOrEqual(t, row.Attempts, 1)
	require.Contains(t, row.LastError, "unroutable")

	conn := testenv.AMQP(t)
	_, err = testenv.Channel(t, conn).QueueDeclare(missing, true, false, false, false, nil)
	require.NoError(t, err)
	code, out, errOut = b.cli(t, "outbox", "retry")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "3 failing rows of "+b.table+" are due now")
	var due int
	require.NoError(t, b.db.Get(&due, `SELECT count(*) FROM `+b.table+` WHERE next_attempt_at <= clock_timestamp()`))
	require.Equal(t, 3, due)
	runRelay(t, b.store, pub, cfg)
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, missing) == 3 }, 2*time.Minute, 10*time.Millisecond,
		"a relay publishes them at once (their next attempts were minutes away)")
	require.Eventually(t, func() bool {
		code, out, _ := b.cli(t, "outbox", "stats")
		return code == 0 && regexp.MustCompile(regexp.QuoteMeta(b.table)+` +│ +0 │ +0 │ +0 │ - +│`).MatchString(out)
	}, time.Minute, 10*time.Millisecond, "nothing left in the outbox")
	code, out, errOut = b.cli(t, "outbox", "retry")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0 failing rows")
}

// A row whose topic, event id and error carry escape sequences (a producer
// that names topics after its input; a broker's error quoting them): stats,
// list as a table and as JSON and retry print no raw control character,
// bound what they show, and the JSON decodes to the exact contents.
func TestOutboxCommandsEscapeHostileRows(t *testing.T) {
	t.Parallel()
	b := newOutboxBed(t)
	topic := "orders" + hostile
	tx, err := b.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	m := message.NewMessage("m-"+hostile, nil)
	m.Metadata.Set(sluice.EventIDKey, "evt-"+hostile)
	require.NoError(t, b.store.Write(t.Context(), tx, topic, m))
	require.NoError(t, tx.Commit())
	lastError := "unroutable: " + hostile + " " + strings.Repeat("x", 10_000)
	_, err = b.db.Exec(`UPDATE `+b.table+` SET attempts = 2, last_error = $1, next_attempt_at = now() + interval '1 hour'`, lastError)
	require.NoError(t, err)

	check := func(args ...string) string {
		t.Helper()
		code, out, errOut := b.cli(t, args...)
		require.Equal(t, 0, code, errOut)
		requireNoRawControl(t, strings.Join(args, " ")+" (stdout)", out)
		requireNoRawControl(t, strings.Join(args, " ")+" (stderr)", errOut)
		return out
	}
	check("outbox", "stats")
	for _, args := range [][]string{{"outbox", "list"}, {"outbox", "list", "--failing"}} {
		out := check(args...)
		require.Contains(t, out, `orders\x1b]0;OWNED\x07\x1b[2J`, "%v: the topic escaped, not dropped", args)
		require.Contains(t, out, `evt-\x1b]0;OWNED`)
		require.Contains(t, out, `unroutable: \x1b]0;OWNED\x07\x1b[2J`, "the error escaped (wrapped at 72 columns)")
		require.Less(t, strings.Count(out, "x"), 1024, "the 10 KB error is bounded (the relay records at most 1,024 bytes)")
	}
	out := check("outbox", "list", "--json")
	require.Contains(t, out, `\u202eevil`)
	require.Contains(t, out, `\u009b31m`)
	var row outboxRowJSON
	require.NoError(t, json.Unmarshal([]byte(out), &row))
	require.Equal(t, topic, row.Topic, "the JSON decodes to the exact contents")
	require.Equal(t, "m-"+hostile, row.MessageID)
	require.Equal(t, "evt-"+hostile, row.EventID)
	require.Equal(t, lastError, row.LastError)
	out = check("outbox", "retry")
	require.Contains(t, out, "1 failing rows")
}

// Usage errors exit 2; a database or table that is not there exits 1,
// naming it and never the password; nothing is created. stats reads
// several tables at once.
func TestOutboxCommandsRefuseWhatTheyCannotRead(t *testing.T) {
	t.Parallel()
	b := newOutboxBed(t)
	other := newOutboxBed(t)
	other.write(t, "elsewhere", "m-1")
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(append([]string{"--audit", filepath.Join(t.TempDir(), "audit.jsonl")}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, _, errOut := cli("outbox", "stats")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--db is required")
	code, _, errOut = b.cli(t, "outbox", "list", "--limit", "0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--limit 0: want 1 to 10000")
	code, _, errOut = cli("outbox", "list", "--db", testenv.PostgresURL, "--table", "a;b")
	require.Equal(t, 2, code, errOut)
	code, _, errOut = cli("outbox", "retry", "--db", testenv.PostgresURL, "--table", b.table+","+other.table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--table: want one table, got 2")

	missing := strings.Replace(b.table, "sluice_outbox", "nothing_here", 1)
	code, _, errOut = cli("outbox", "stats", "--db", testenv.PostgresURL, "--table", missing)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no outbox table "+missing+" in that database")
	// A service.New with Config.Schema keeps its outbox in that schema: the
	// error names the flag that reaches it.
	require.Contains(t, errOut, "--table SCHEMA.sluice_outbox")
	var created bool
	require.NoError(t, b.db.Get(&created, `SELECT to_regclass($1) IS NOT NULL`, missing))
	require.False(t, created)
	code, _, errOut = cli("outbox", "stats", "--db", "postgres://u:Hidden1@127.0.0.1:1/x?sslmode=disable&connect_timeout=2")
	require.Equal(t, 1, code)
	require.NotContains(t, errOut, "Hidden1")

	code, out, errOut := cli("outbox", "stats", "--db", testenv.PostgresURL, "--table", b.table, "--table", other.table)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, regexp.QuoteMeta(b.table)+` +│ +0 │ +0 │ +0 │ - +│`, out)
	require.Regexp(t, regexp.QuoteMeta(other.table)+` +│ +1 │ +0 │ +0 │ \d+s \(`, out)
	require.Equal(t, 1, strings.Count(out, "PENDING"), fmt.Sprint("one table:\n", out))
}

// The CLI looks a table up as the stores' statements name it (quoted: case
// matters), so it creates nothing and names what is missing.
func TestTablesExistNamesTablesAsTheStoresDo(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	testenv.Migrate(t, db, sluicesql.Config{Schema: schema})
	found, err := tablesExist(t.Context(), db, schema+".sluice_outbox", schema+".sluice_order_keys")
	require.NoError(t, err)
	require.True(t, found)
	found, err = tablesExist(t.Context(), db, schema+".sluice_outbox", schema+".Sluice_outbox") // another name once quoted
	require.NoError(t, err)
	require.False(t, found)
}
