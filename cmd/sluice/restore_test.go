package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// archived fills the bed's poison queue (e1..e6), archives it to a file and
// returns the file's lines; the poison queue is then empty.
func archived(t *testing.T, b *bed, args ...string) (string, []string) {
	t.Helper()
	b.fill(t)
	file := filepath.Join(t.TempDir(), "archive.jsonl")
	code, _, errOut := b.cli(t, append([]string{"dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to", file}, args...)...)
	require.Equal(t, 0, code, errOut)
	require.Zero(t, testenv.QueueDepth(t, testenv.AMQP(t), b.topo.Config().PoisonQueue))
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(raw), "\n")
	require.Equal(t, "", lines[len(lines)-1])
	return file, lines[:len(lines)-1]
}

// edit rewrites line i (from 1) of the archive with fn applied to its JSON.
func edit(t *testing.T, file string, lines []string, i int, fn func(map[string]any)) {
	t.Helper()
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[i-1]), &rec))
	fn(rec)
	b, err := json.Marshal(rec)
	require.NoError(t, err)
	out := append([]string(nil), lines...)
	out[i-1] = string(b) + "\n"
	require.NoError(t, os.WriteFile(file, []byte(strings.Join(out, "")), 0o600))
}

// Issue 18 item 8: a tampered archive line naming another queue publishes
// nothing, anywhere: its digest no longer matches (refused naming the
// line); nothing before it was published either. Before, its body went to
// the queue the line named, after the lines before it.
func TestRestoreRefusesATamperedQueue(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	other := declareOther(t)
	file, lines := archived(t, b)
	require.Len(t, lines, 6)
	require.Contains(t, lines[0], `"digest":"sha256:`)
	edit(t, file, lines, 3, func(rec map[string]any) { rec["queue"] = other })

	for _, dry := range []bool{true, false} {
		args := []string{"dlq", "restore", "--from", file}
		if dry {
			args = append(args, "--dry-run")
		}
		code, _, errOut := b.cli(t, args...)
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, file+" line 3: the record's digest does not match its contents")
		require.Contains(t, errOut, "nothing was restored")
	}
	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, other), "nothing reached the queue the line names")
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue), "nothing before it was published")

	// --to says where: every record goes there, the tampered one refused
	// still (its digest), so nothing again.
	code, _, errOut := b.cli(t, "dlq", "restore", "--from", file, "--to", b.topo.Config().PoisonQueue)
	require.Equal(t, 1, code, errOut)
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))

	// The line as it was: every record back to its poison queue.
	require.NoError(t, os.WriteFile(file, []byte(strings.Join(lines, "")), 0o600))
	code, _, errOut = b.cli(t, "dlq", "restore", "--from", file)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"e1", "e2", "e3", "e4", "e5", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue))
	require.Zero(t, testenv.QueueDepth(t, conn, other))
}

// declareOther declares another service's queue, of t's own.
func declareOther(t *testing.T) string {
	t.Helper()
	other := testenv.Name("payments")
	_, err := testenv.Channel(t, testenv.AMQP(t)).QueueDeclare(other, true, false, false, false, nil)
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, other)
	return other
}

// A truncated archive (its last line cut short, as a torn write or a
// partial copy leaves it) and a line that is not a record are refused
// before anything is published, naming the line. Before, the records
// before the bad line were published and the run stopped there.
func TestRestoreValidatesTheWholeFileFirst(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	file, lines := archived(t, b)
	whole := strings.Join(lines, "")
	conn := testenv.AMQP(t)
	for name, tc := range map[string]struct {
		contents, want string
	}{
		"cut mid-line":    {whole[:len(whole)-len(lines[5])/2], "line 6: truncated: the record has no end of line"},
		"no final EOL":    {whole[:len(whole)-1], "line 6: truncated: the record has no end of line"},
		"not JSON":        {strings.Join(lines[:4], "") + "{\"queue\":\n" + strings.Join(lines[4:], ""), "line 5: not an archive record"},
		"two on one line": {strings.Join(lines[:1], "") + strings.TrimSuffix(lines[1], "\n") + lines[2] + strings.Join(lines[3:], ""), "line 2: not an archive record: more than one JSON value"},
	} {
		require.NoError(t, os.WriteFile(file, []byte(tc.contents), 0o600))
		code, _, errOut := b.cli(t, "dlq", "restore", "--from", file)
		require.Equal(t, 1, code, "%s: %s", name, errOut)
		require.Contains(t, errOut, file+" "+tc.want, name)
		require.Contains(t, errOut, "nothing was restored", name)
		require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue), "%s: nothing published", name)
	}
}

// A record whose contents changed (its payload, its reason, a header) is
// refused naming its line; a record without a digest only with
// --accept-undigested.
func TestRestoreRefusesADigestMismatchNamingTheLine(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	file, lines := archived(t, b)
	conn := testenv.AMQP(t)
	for _, tc := range []struct {
		i  int
		fn func(map[string]any)
	}{
		{2, func(rec map[string]any) { rec["payload"] = `{"eventId":"e2","amount":1000000}` }},
		{4, func(rec map[string]any) { rec["metadata"].(map[string]any)["sluice_event_id"] = "e-forged" }},
		{5, func(rec map[string]any) { rec["digest"] = "sha256:00" }},
		{6, func(rec map[string]any) { delete(rec, "digest") }}, // last: the file keeps this edit
	} {
		i := tc.i
		edit(t, file, lines, i, tc.fn)
		code, _, errOut := b.cli(t, "dlq", "restore", "--from", file)
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, file+" line "+string(rune('0'+i))+": the record's digest does not match its contents")
		require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))
	}
	// Line 6 has no digest (the last edit): an old archive's record,
	// restored only when the operator says so.
	code, _, errOut := b.cli(t, "dlq", "restore", "--from", file, "--accept-undigested")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"e1", "e2", "e3", "e4", "e5", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue))
}

// With a signing key, archive signs each record and restore refuses one
// that is not signed with it — a record whose digest was recomputed after
// an edit among them (the unit tests show that); without the key at
// archive, restore with it refuses everything.
func TestRestoreWithASigningKey(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	dir := t.TempDir()
	key, otherKey := filepath.Join(dir, "sluice.key"), filepath.Join(dir, "other.key")
	require.NoError(t, os.WriteFile(key, []byte(strings.Repeat("k", 32)+"\n"), 0o600))
	require.NoError(t, os.WriteFile(otherKey, []byte(strings.Repeat("o", 32)), 0o600))
	file, lines := archived(t, b, "--signing-key-file", key)
	require.Contains(t, lines[0], `"signature":"v2:`)
	conn := testenv.AMQP(t)

	code, _, errOut := b.cli(t, "dlq", "restore", "--from", file, "--signing-key-file", otherKey)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, file+" line 1: the record is not signed with the signing key")
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))

	code, _, errOut = b.cli(t, "dlq", "restore", "--from", file, "--signing-key-file", key)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"e1", "e2", "e3", "e4", "e5", "e6"}, ids(t, b.topo.Config().PoisonQueue))

	unsigned, _ := archived(t, b)
	code, _, errOut = b.cli(t, "dlq", "restore", "--from", unsigned, "--signing-key-file", key)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, unsigned+" line 1: the record is not signed with the signing key: it has no signature")
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))
}

// From a table the same: a row edited to name another queue (its column
// and its record) is refused naming the row, before any row is published
// or marked.
func TestRestoreFromATableRefusesATamperedRow(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.fill(t)
	other := declareOther(t)
	db := testenv.Postgres(t)
	table := testenv.Schema(t, db) + ".sluice_archive"
	code, _, errOut := b.cli(t, "dlq", "archive", "--queue", b.topo.Config().PoisonQueue, "--to-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	var id int64
	require.NoError(t, db.Get(&id, `SELECT id FROM `+table+` WHERE event_id = 'e4'`))
	_, err := db.Exec(`UPDATE `+table+` SET queue = $1, record = jsonb_set(record::jsonb, '{queue}', to_jsonb($1::text))::text WHERE id = $2`, other, id)
	require.NoError(t, err)

	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 1, code, errOut)
	require.Regexp(t, `row \d+: the record's digest does not match its contents`, errOut)
	require.Contains(t, errOut, "nothing was restored")
	conn := testenv.AMQP(t)
	require.Zero(t, testenv.QueueDepth(t, conn, other))
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))
	var marked int
	require.NoError(t, db.Get(&marked, `SELECT count(*) FROM `+table+` WHERE restored_at IS NOT NULL`))
	require.Zero(t, marked)

	// The column alone edited: refused too.
	_, err = db.Exec(`UPDATE `+table+` SET record = jsonb_set(record::jsonb, '{queue}', to_jsonb($1::text))::text WHERE id = $2`, b.topo.Config().PoisonQueue, id)
	require.NoError(t, err)
	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "its queue column")
	require.Zero(t, testenv.QueueDepth(t, conn, b.topo.Config().PoisonQueue))

	_, err = db.Exec(`UPDATE `+table+` SET queue = $1 WHERE id = $2`, b.topo.Config().PoisonQueue, id)
	require.NoError(t, err)
	code, _, errOut = b.cli(t, "dlq", "restore", "--from-table", table, "--db", testenv.PostgresURL)
	require.Equal(t, 0, code, errOut)
	require.ElementsMatch(t, []string{"e1", "e2", "e3", "e4", "e5", "e6"}, peekIDs(t, b.topo.Config().PoisonQueue))
}
