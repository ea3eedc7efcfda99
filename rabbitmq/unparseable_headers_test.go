package rabbitmq_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
	"github.com/sluicemq/sluice/retrytiers"
	"github.com/sluicemq/sluice/router"
	"github.com/sluicemq/sluice/stage"
)

// hostileHeaders are headers RabbitMQ accepts from any producer and
// amqp091-go v1.17.0 refuses to read (its reader closes the connection
// with FRAME_ERROR), each with what the diagnosis says.
func hostileHeaders() []struct {
	name    string
	headers amqp.Table
	reason  string
} {
	deep := amqp.Table{"leaf": "x"}
	for range 40 {
		deep = amqp.Table{"n": deep}
	}
	many := amqp.Table{}
	for i := range 10000 {
		many[fmt.Sprintf("h%05d", i)] = int32(i)
	}
	nested := amqp.Table{}
	for i := range 9000 {
		nested[fmt.Sprintf("k%04d", i)] = nil
	}
	return []struct {
		name    string
		headers amqp.Table
		reason  string
	}{
		{"array", amqp.Table{"tags": make([]any, 9000), "sluice_event_id": "evt-hostile"}, `headers unparseable: header "tags": an array of more than 8192 items`},
		{"deep", amqp.Table{"deep": deep}, `headers unparseable: header "deep": tables or arrays nested deeper than 32 levels`},
		{"many", many, "headers unparseable: 10000 headers, more than 8192"},
		{"nested", amqp.Table{"ok": "x", "n": nested}, `headers unparseable: header "n": a table of more than 8192 entries`},
	}
}

// publishRaw publishes with amqp091-go's own channel (which encodes any
// table), confirmed, so the message is in queue when it returns.
func publishRaw(t *testing.T, conn *amqp.Connection, queue string, p amqp.Publishing) {
	t.Helper()
	ch := testenv.Channel(t, conn)
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", queue, true, false, p)
	require.NoError(t, err)
	ok, err := dc.WaitContext(t.Context())
	require.NoError(t, err)
	require.True(t, ok, "confirmed")
}

// recordingLogger keeps the messages of its Error lines.
type recordingLogger struct {
	watermill.NopLogger
	mu     *sync.Mutex
	errors *[]string
}

func newRecordingLogger() recordingLogger {
	return recordingLogger{mu: &sync.Mutex{}, errors: new([]string)}
}

func (l recordingLogger) Error(msg string, _ error, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.errors = append(*l.errors, msg)
}

func (l recordingLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l recordingLogger) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range *l.errors {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// Issue 18, item 1 (issue 42: upstream's client behind the frame filter).
// A header array of 9,000 items, tables nested 40 deep, 10,000 headers, a
// nested table of 9,000 entries: amqp091-go v1.16.0 refused the frame and closed the
// consumer's connection (501), the broker handed the same head message to
// the next connection, and 0 of the 300 good messages behind them were
// processed. Through Sluice's frame filter (internal/amqpframe) each is
// isolated in the poison queue with its reason, the handler never sees it,
// the connection stays up, and all 300 are processed. (Fails on the code
// before: no good message is processed, the queue stalls.)
func TestUnparseableHeadersAreIsolatedNotLooped(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("unparseable")
	logger := newRecordingLogger()
	b, err := rabbitmq.NewBroker(t.Context(), rabbitmq.BrokerConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL, Logger: logger},
		Topology: rabbitmq.TopologyConfig{Queue: queue, TierDelays: []time.Duration{100 * time.Millisecond}}})
	require.NoError(t, err)
	testenv.DeleteQueuesAtEnd(t, queue, queue+".poison", queue+".retry.100ms")
	conn := testenv.AMQP(t)

	hostile := hostileHeaders()
	for i, h := range hostile {
		publishRaw(t, conn, queue, amqp.Publishing{Headers: h.headers, MessageId: "hostile-" + h.name,
			ContentType: "application/json", Body: []byte(fmt.Sprintf(`{"hostile":%d}`, i))})
	}
	const good = 300
	for i := range good {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(sluice.EventIDKey, fmt.Sprint("evt-", i))
		require.NoError(t, b.Publisher().Publish(queue, m))
	}

	var mu sync.Mutex
	seen := map[string]int{}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = router.Add(r, router.HandlerConfig{
		Broker: b, Name: "unparseable",
		Handler: func(msg *message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			seen[msg.Metadata.Get(sluice.EventIDKey)]++
			return nil
		},
		Stages: router.Stages{Poison: &poison.Config{}, Retry: &retrytiers.Config{}, Classify: &stage.ClassifyConfig{}},
	})
	require.NoError(t, err)
	done := testenv.RunRouter(context.Background(), r)
	// The 300 waited for while they come (a loaded machine reads the
	// hostile frames slowly): a minute without one is a stalled queue.
	if err := testenv.AwaitCount(good, time.Minute, 10*time.Minute, func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }); err != nil {
		require.FailNow(t, "the queue stalled", "good messages processed: %v; %d reconnects", err, logger.count("Consuming stopped"))
	}
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue+".poison") == len(hostile) },
		time.Minute, 20*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	require.NoError(t, b.Close())

	for i := range good {
		require.Equal(t, 1, seen[fmt.Sprint("evt-", i)], "evt-%d", i)
	}
	require.Len(t, seen, good, "no hostile message reached the handler")
	require.Zero(t, logger.count("Consuming stopped"), "the consumer's connection never closed")
	require.Equal(t, len(hostile), logger.count("Delivery's headers unparseable; isolated"))
	require.Zero(t, testenv.QueueDepth(t, conn, queue))

	isolated := testenv.Drain(t, conn, queue+".poison")
	require.Len(t, isolated, len(hostile))
	byID := map[string]amqp.Delivery{}
	for _, d := range isolated { // isolated concurrently: in any order
		byID[d.MessageId] = d
	}
	for i, h := range hostile {
		d, ok := byID["hostile-"+h.name]
		require.True(t, ok, h.name)
		require.NotContains(t, d.Headers, metakeys.HeadersError, "the copy's headers are Sluice's diagnosis only")
		require.Equal(t, "poison", d.Headers[metakeys.PoisonClass], h.name)
		require.Contains(t, d.Headers[metakeys.PoisonReason], h.reason, h.name)
		require.Equal(t, queue, d.Headers[metakeys.PoisonQueue])
		require.Equal(t, "*", d.Headers[metakeys.PoisonDropped], "every producer header was left out")
		require.Equal(t, "application/json", d.ContentType, "the properties are kept")
		require.Equal(t, fmt.Sprintf(`{"hostile":%d}`, i), string(d.Body))
		require.NotContains(t, d.Headers, sluice.EventIDKey, "no header of the unreadable table is believed")
	}
}
