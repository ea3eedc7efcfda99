package dlq_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
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

// The facade on a real poison queue: Open names it, and each method acts
// on what its filter selects and leaves the rest where it was — Stats and
// Inspect read everything and remove nothing, Replay sends the selected
// back to the queue each names, Archive writes before it removes, Discard
// removes and names what it removed; a queue that does not exist is
// ErrNoQueue on its first read.
func TestAQueueActsOnWhatItsFilterSelects(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	base := testenv.Name("dlq_facade")
	poisonQ := base + poisonqueue.Suffix
	testenv.DeleteQueuesAtEnd(t, base, poisonQ)
	conn := testenv.AMQP(t)
	ch := testenv.Channel(t, conn)
	for _, q := range []string{base, poisonQ} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	classes := []string{"exhausted", "poison", "exhausted", "poison", "exhausted"}
	for i, class := range classes {
		require.NoError(t, testenv.Confirm(t, ch).PublishWithContext(ctx, "", poisonQ, false, false, amqp.Publishing{
			Headers: amqp.Table{metakeys.PoisonClass: class, metakeys.PoisonReason: "order o-" + fmt.Sprint(i) + " cannot be priced",
				metakeys.PoisonQueue: base, sluice.EventIDKey: fmt.Sprintf("e%d", i+1)},
			Body: []byte(fmt.Sprintf(`{"n":%d}`, i+1))}))
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	q := dlq.Open(conn, poisonQ, dlq.Config{Publisher: pub, Operator: "tester"})
	s, err := q.Stats(ctx, dlq.Filter{}, 0)
	require.NoError(t, err)
	require.Equal(t, 5, s.Total)
	require.Equal(t, map[string]int{"exhausted": 3, "poison": 2}, s.ByClass)
	require.Equal(t, map[string]int{"order o-# cannot be priced": 5}, s.ByFingerprint)
	ms, err := q.Inspect(ctx, dlq.Filter{Classes: []string{"poison"}}, 0)
	require.NoError(t, err)
	require.Len(t, ms, 2)
	require.Equal(t, []string{"e2", "e4"}, []string{ms[0].EventID, ms[1].EventID})
	require.Equal(t, 5, testenv.QueueDepth(t, conn, poisonQ), "reads remove nothing")

	res, err := q.Replay(ctx, dlq.ReplayConfig{Filter: dlq.Filter{Classes: []string{"exhausted"}}})
	require.NoError(t, err)
	require.Equal(t, 3, res.Replayed)
	require.Equal(t, map[string]int{base: 3}, res.ByTarget)
	require.Equal(t, 3, testenv.QueueDepth(t, conn, base), "replayed to the queue each names")
	require.Equal(t, 2, testenv.QueueDepth(t, conn, poisonQ))

	file := filepath.Join(t.TempDir(), "archive.jsonl")
	sink, err := dlq.OpenFileSink(file)
	require.NoError(t, err)
	res, err = q.Archive(ctx, dlq.ArchiveConfig{Limit: 1, Sink: sink})
	require.NoError(t, err)
	require.NoError(t, sink.Close())
	require.Equal(t, 1, res.Replayed)
	f, err := os.Open(file)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		lines++
		require.Contains(t, sc.Text(), `"event_id":"e2"`, "the first selected, archived")
	}
	require.Equal(t, 1, lines)

	res, items, err := q.Discard(ctx, dlq.Filter{}, 0, false)
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	require.Equal(t, []string{"e4"}, items)
	require.Zero(t, testenv.QueueDepth(t, conn, poisonQ))

	_, err = dlq.Open(conn, testenv.Name("dlq_missing"), dlq.Config{}).Inspect(ctx, dlq.Filter{}, 0)
	require.ErrorIs(t, err, dlq.ErrNoQueue)
}
