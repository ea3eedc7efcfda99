package main

import (
	"encoding/json"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/testenv"
)

// Spring AMQP's messages in a poison queue, with no Sluice diagnosis and no
// event id: stats counts them by the Spring type (__TypeId__, else the type
// property), and inspect names each by its message id, else its position,
// and shows the message id escaped (issue 20, item 3: stats said "EVENT TYPE
// (none)", inspect "event -" and no message id).
func TestForeignProducersTypeAndMessageID(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	q := b.topo.Config().PoisonQueue
	ch := testenv.Channel(t, testenv.AMQP(t))
	for _, p := range []amqp.Publishing{
		{Type: "order.created", MessageId: "spring-msg-1", CorrelationId: "corr-42",
			Headers: amqp.Table{"__TypeId__": "com.example.OrderCreated", "retries": int32(3)}, Body: []byte(`{"id":1}`)},
		{Type: "order.cancelled", Body: []byte(`{"id":2}`)},
		{MessageId: "evil\x1b]0;pwned\x07", Body: []byte(`{"id":3}`)},
	} {
		require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", q, false, false, p))
	}

	code, out, errOut := b.cli(t, "dlq", "stats", "--queue", q, "--json")
	require.Equal(t, 0, code, errOut)
	var s dlq.Stats
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.Equal(t, map[string]int{"com.example.OrderCreated": 1, "order.cancelled": 1, "(none)": 1}, s.ByEventType)

	code, out, errOut = b.cli(t, "dlq", "inspect", "--queue", q)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1. (message id spring-msg-1)", "named by its message id")
	require.Contains(t, out, "2. (position 2)", "no message id either: named by its position")
	require.Regexp(t, `│ message id +│ evil\\x1b\]0;pwned\\x07 │`, out, "escaped")
	require.NotContains(t, out, "event -")
	require.NotContains(t, out, "\x1b")
	require.Equal(t, 2, strings.Count(out, "spring-msg-1"), "in the title and its row:\n%s", out)
	require.Contains(t, out, "com.example.OrderCreated")
	require.Equal(t, 3, testenv.QueueDepth(t, testenv.AMQP(t), q), "nothing removed")
}
