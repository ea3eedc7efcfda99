package dlq_test

import (
	"fmt"
	"regexp"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/poisonqueue"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// poisonBed is a consumer queue and its poison queue holding six poisoned
// messages e1…e6: odd ones "poison" (order.cancelled, reason "missing
// sku"), even ones "exhausted" (order.created), each after 3 attempts —
// what cmd/sluice's tests fill through the CLI, here on the package.
func poisonBed(t *testing.T) (conn *amqp.Connection, base, poisonQ string, pub *rabbitmq.Publisher) {
	t.Helper()
	base = testenv.Name("dlq_replay")
	poisonQ = base + poisonqueue.Suffix
	testenv.DeleteQueuesAtEnd(t, base, poisonQ)
	conn = testenv.AMQP(t)
	ch := testenv.Channel(t, conn)
	for _, q := range []string{base, poisonQ} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	for i := 1; i <= 6; i++ {
		class, eventType, reason := "exhausted", "order.created", "timeout after 3 attempts"
		if i%2 == 1 {
			class, eventType, reason = "poison", "order.cancelled", `missing "sku"`
		}
		require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(t.Context(), "", poisonQ, false, false, amqp.Publishing{
			Headers: amqp.Table{metakeys.PoisonClass: class, metakeys.PoisonReason: reason, metakeys.PoisonQueue: base,
				sluice.EventIDKey: fmt.Sprintf("e%d", i), sluice.EventTypeKey: eventType, sluice.AttemptKey: "3"},
			Body: []byte(fmt.Sprintf(`{"n":%d}`, i))}))
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return conn, base, poisonQ, pub
}

func eventIDs(ds []amqp.Delivery) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i], _ = d.Headers[sluice.EventIDKey].(string)
	}
	return ids
}

// A replayed copy carries the event and its replay provenance (who, from
// where, its class, the count, when), not its failure history: the attempt
// count is reset and the poison headers are gone. The messages a filter
// does not select stay, in their order; a filter by reason or event type
// selects as one by class does. (As cmd/sluice's
// TestReplayByFilterMovesExactlyTheSelected checks through the CLI.)
func TestReplayedCopiesCarryProvenanceNotTheFailureHistory(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn, base, poisonQ, pub := poisonBed(t)
	q := dlq.Open(conn, poisonQ, dlq.Config{Operator: "tester", Publisher: pub})

	res, err := q.Replay(ctx, dlq.ReplayConfig{Filter: dlq.Filter{Classes: []string{"exhausted"}}, Batch: 2})
	require.NoError(t, err)
	require.Equal(t, 6, res.Scanned)
	require.Equal(t, 3, res.Selected)
	require.Equal(t, 3, res.Replayed)
	require.Equal(t, map[string]int{base: 3}, res.ByTarget)

	replayed := testenv.Drain(t, conn, base)
	require.Equal(t, []string{"e2", "e4", "e6"}, eventIDs(replayed))
	for _, d := range replayed {
		require.Nil(t, d.Headers[sluice.AttemptKey], "the attempt count is reset")
		require.Nil(t, d.Headers[metakeys.PoisonClass], "the failure history is not replayed")
		require.Nil(t, d.Headers[metakeys.PoisonReason])
		require.Equal(t, "tester", d.Headers[metakeys.ReplayedBy])
		require.Equal(t, poisonQ, d.Headers[metakeys.ReplayedFrom])
		require.Equal(t, "exhausted", d.Headers[metakeys.ReplayedClass])
		require.Equal(t, "1", d.Headers[metakeys.ReplayCount])
		require.NotEmpty(t, d.Headers[metakeys.ReplayedAt])
	}
	ms, err := q.Inspect(ctx, dlq.Filter{}, 0)
	require.NoError(t, err)
	require.Len(t, ms, 3)
	require.Equal(t, []string{"e1", "e3", "e5"}, []string{ms[0].EventID, ms[1].EventID, ms[2].EventID}, "the rest stays, in order")

	_, err = q.Replay(ctx, dlq.ReplayConfig{Filter: dlq.Filter{ErrorMatch: regexp.MustCompile(`"sku"`), EventTypes: []string{"order.cancelled"}}, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"e1", "e3"}, eventIDs(testenv.Drain(t, conn, base)), "by reason and event type, at most Limit")
	require.Equal(t, 1, testenv.QueueDepth(t, conn, poisonQ))
}

// A dry run plans each selected message with its target, checks the
// targets exist, and changes nothing; a message with no target stops it,
// named. (As cmd/sluice's TestReplayDryRunChangesNothing checks through
// the CLI.)
func TestReplayDryRunPlansEachMessageAndChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn, base, poisonQ, pub := poisonBed(t)
	q := dlq.Open(conn, poisonQ, dlq.Config{Operator: "tester", Publisher: pub})

	res, err := q.Replay(ctx, dlq.ReplayConfig{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, 6, res.Selected)
	require.Zero(t, res.Replayed)
	require.Len(t, res.Plan, 6, "each selected message with its target")
	require.Equal(t, dlq.Planned{Message: "event e1", Target: base}, res.Plan[0])
	require.Equal(t, 6, testenv.QueueDepth(t, conn, poisonQ), "nothing changed")
	require.Zero(t, testenv.QueueDepth(t, conn, base))

	ch := testenv.Channel(t, conn)
	require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(ctx, "", poisonQ, false, false, amqp.Publishing{Body: []byte("{}")}))
	_, err = q.Replay(ctx, dlq.ReplayConfig{DryRun: true})
	require.ErrorIs(t, err, dlq.ErrNoTarget, "the real run would stop on it")
	require.Equal(t, 7, testenv.QueueDepth(t, conn, poisonQ))
}
