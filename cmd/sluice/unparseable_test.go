package main

import (
	"encoding/json"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/testenv"
)

// Issue 18, item 1: a message whose headers amqp091-go v1.16.0 refuses to
// parse (an array of 9,000 items, tables nested 40 deep, 10,000 headers)
// closed the CLI's connection, so stats, inspect and discard died on it and
// the operator could not remove it with the tool. Now stats counts and names
// them (position, message id, size, reason), inspect shows them, replay
// refuses them by name, and discard --unreadable removes exactly them. (Fails
// on the code before: stats exits with the connection's 501.)
func TestUnparseableHeadersInThePoisonQueue(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	q := b.topo.Config().PoisonQueue
	b.poisoned(t, "e1", "order.created", sluice.Poison(fmt.Errorf(`missing field "sku"`)))
	b.poisoned(t, "e2", "order.created", sluice.Poison(fmt.Errorf(`missing field "qty"`)))
	deep := amqp.Table{"leaf": "x"}
	for range 40 {
		deep = amqp.Table{"n": deep}
	}
	many := amqp.Table{}
	for i := range 10000 {
		many[fmt.Sprintf("h%05d", i)] = int32(i)
	}
	ch := testenv.Channel(t, testenv.AMQP(t))
	require.NoError(t, ch.Confirm(false))
	for _, p := range []amqp.Publishing{
		{Headers: amqp.Table{"tags": make([]any, 9000)}, MessageId: "hostile-array", Body: []byte("array")},
		{Headers: amqp.Table{"deep": deep}, Body: []byte("deep!")},
		{Headers: many, MessageId: "hostile-many", Body: []byte("many")},
	} {
		dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", q, true, false, p)
		require.NoError(t, err)
		ok, err := dc.WaitContext(t.Context())
		require.NoError(t, err)
		require.True(t, ok)
	}
	b.poisoned(t, "e3", "order.created", sluice.Poison(fmt.Errorf(`missing field "sku"`)))

	code, out, errOut := b.cli(t, "dlq", "stats", "--queue", q)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "6 messages")
	require.Contains(t, out, "3 messages whose headers could not be parsed")
	require.Regexp(t, `3\s+│ hostile-array\s+│\s+5 │ headers unparseable: header "tags": an array of more than 8192 items`, out)
	require.Regexp(t, `4\s+│ -\s+│\s+5 │ headers unparseable: header "deep": tables or arrays nested deeper than 32 levels`, out)
	require.Regexp(t, `5\s+│ hostile-many\s+│\s+4 │ headers unparseable: 10000 headers, more than 8192`, out)

	code, out, errOut = b.cli(t, "dlq", "stats", "--queue", q, "--json")
	require.Equal(t, 0, code, errOut)
	var s dlq.Stats
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.Equal(t, 6, s.Total)
	require.Equal(t, 3, s.Unreadable)
	require.Equal(t, []int{3, 4, 5}, []int{s.UnreadableFirst[0].Position, s.UnreadableFirst[1].Position, s.UnreadableFirst[2].Position})

	code, out, errOut = b.cli(t, "dlq", "inspect", "--queue", q, "--unreadable")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "3 messages shown")
	require.Contains(t, out, `not parsed: headers unparseable: header "tags"`)
	require.Contains(t, out, "hostile-many")

	code, _, errOut = b.cli(t, "dlq", "replay", "--queue", q, "--dry-run")
	require.NotEqual(t, 0, code, "a replay would drop the headers")
	require.Contains(t, errOut, "hostile-array")
	require.Contains(t, errOut, "headers could not be read")

	code, _, errOut = b.cli(t, "dlq", "discard", "--queue", q, "--unreadable", "--reason", "hostile headers")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"e1", "e2", "e3"}, peekIDs(t, q), "exactly the unreadable ones removed, the rest in order")
	recs := b.auditLines(t)
	last := recs[len(recs)-1]
	require.Equal(t, "dlq discard", last.Command)
	require.Equal(t, []string{"hostile-array", "unreadable message at position 4 (5 bytes)", "hostile-many"}, last.Items)
	require.Equal(t, "true", last.Filters["unreadable"])
}
