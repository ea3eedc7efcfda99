package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/ordering"

	"github.com/sluicemq/sluice/sluicesql"
)

// The on-call's path through a key the ordering stage holds behind a
// poisoned head: list shows it (head, state, held, the head's reason
// redacted and its terminal escapes inert); skip, with a reason, gives the
// head up — the key is releasing, the run is in the audit log; a key that
// does not wait is said so; without --reason or --consumer nothing moves.
func TestOrderListAndSkip(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	schema := testenv.Schema(t, db)
	prefix := schema + ".sluice_order"
	store := testenv.Migrate(t, db, sluicesql.Config{Schema: schema}).Order
	g, err := store.Lock(t.Context(), "ledger", "acct-\x1b[31m7")
	require.NoError(t, err)
	require.NoError(t, g.Block(t.Context(), "evt-5", true, "poison: bad version amqp://u:Hidden1@h/"))
	for _, id := range []string{"evt-6", "evt-7"} {
		require.NoError(t, g.Hold(t.Context(), ordering.Held{EventID: id, UUID: id, Payload: []byte(`{}`)}))
	}
	require.NoError(t, g.Commit(t.Context()))

	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	cli := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		args = append([]string{"--audit", audit}, args...)
		code := run(append(args, "--db", testenv.PostgresURL, "--table-prefix", prefix), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := cli("order", "list", "--consumer", "ledger")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "evt-5")
	require.Contains(t, out, "poisoned")
	require.NotContains(t, out, "Hidden1")
	require.NotContains(t, out, "\x1b", "a key's terminal escape is shown inert")
	code, out, errOut = cli("order", "list", "--consumer", "ledger", "--json")
	require.Equal(t, 0, code, errOut)
	var k orderKeyJSON
	require.NoError(t, json.Unmarshal([]byte(strings.Split(out, "\n")[0]), &k))
	require.Equal(t, orderKeyJSON{Key: "acct-\x1b[31m7", Head: "evt-5", State: "poisoned", Held: 2, Since: k.Since, Reason: k.Reason}, k)
	require.NotContains(t, k.Reason, "Hidden1")

	code, _, errOut = cli("order", "skip", "--consumer", "ledger", "--key", "acct-\x1b[31m7")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--reason is required")
	code, out, errOut = cli("order", "skip", "--consumer", "ledger", "--key", "acct-\x1b[31m7,acct-8", "--reason", "version 3 is retired")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "head evt-5 skipped")
	require.Contains(t, out, "warning: evt-5 stays where it is (the poison queue, a tier): replayed later, it applies after the key's later messages,")
	require.Contains(t, out, "key acct-8: not waiting for a head")
	keys, err := store.Keys(t.Context(), "ledger", 10)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, "", keys[0].Head, "releasing: the handler releases what it holds")
	require.Equal(t, 2, keys[0].Held)
	b, err := os.ReadFile(audit)
	require.NoError(t, err)
	require.Contains(t, string(b), `"command":"order skip"`)
	require.Contains(t, string(b), `"skipped":1`)
	require.Contains(t, string(b), "version 3 is retired")

	code, _, errOut = cli("order", "list")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--consumer is required")
	var out2, errOut2 bytes.Buffer
	code = run([]string{"order", "list", "--consumer", "ledger", "--db", testenv.PostgresURL, "--table-prefix", "nowhere"}, &out2, &errOut2)
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut2.String(), "no ordering tables")
}
