package dlq_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// A classic queue keeps its order through scans that remove some of its
// messages: a full scan that removes some, a scan stopped early that
// removes some of what it read, then a read of the rest — every message
// left once, in the order published. A classic queue with no arguments
// (typed or not) is put back at once by the channel's close, one with
// arguments a nack at a time. On 3.10 and on 4.0 (SLUICE_TEST_AMQP_URL,
// make test-rabbitmq4).
func TestAScanPutsAClassicQueueBackInOrder(t *testing.T) {
	t.Parallel()
	for name, args := range map[string]amqp.Table{
		"typed":          {"x-queue-type": amqp.QueueTypeClassic},
		"untyped":        nil,
		"with arguments": {"x-max-length": int64(1_000_000)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			scansKeepOrder(t, args)
		})
	}
}

func scansKeepOrder(t *testing.T, args amqp.Table) {
	const n = 2000
	conn := testenv.AMQP(t)
	queue := testenv.Name("putback")
	testenv.DeleteQueuesAtEnd(t, queue)
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, args)
	require.NoError(t, err)
	_ = ch.Close()
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	ms := make([]*message.Message, n)
	for i := range ms {
		ms[i] = message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
	}
	require.NoError(t, pub.Publish(queue, ms...))

	removed := map[int]bool{}
	scan := func(stopAt int, remove func(i int) bool) []int {
		var read []int
		_, err := dlq.Scan(t.Context(), conn, queue, func(m *dlq.Message) (bool, error) {
			i, err := strconv.Atoi(string(m.Msg.Payload))
			require.NoError(t, err)
			read = append(read, i)
			if remove(i) {
				removed[i] = true
				require.NoError(t, dlq.Ack(m))
			}
			return len(read) == stopAt, nil
		}, nil)
		require.NoError(t, err)
		return read
	}
	scan(0, func(i int) bool { return i%7 == 0 })
	scan(500, func(i int) bool { return i%5 == 0 })
	read := scan(0, func(int) bool { return false })
	var want []int
	for i := range n {
		if !removed[i] {
			want = append(want, i)
		}
	}
	require.Equal(t, want, read, "every message left, once, in the order published")
}

// A quorum queue with a delivery limit and a name of AMQP's 255 bytes,
// holding a foreign producer's messages (Spring's __TypeId__, a .NET
// client's properties, headers named like Sluice's own, a long header
// value), read whole by a scan that leaves every message: they come back
// in their order — returned 8 at a time past the 32 commands RabbitMQ's
// quorum queue client holds — with their headers and properties as
// published. On 3.10 and on 4.0 (SLUICE_TEST_AMQP_URL, make
// test-rabbitmq4).
func TestAScanPutsAForeignQuorumQueueAtTheNameLimitBackAsItWas(t *testing.T) {
	t.Parallel()
	const n = 100
	conn := testenv.AMQP(t)
	name := testenv.Name("putbackq")
	queue := name + strings.Repeat("q", 255-len(name))
	testenv.DeleteQueuesAtEnd(t, queue)
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": amqp.QueueTypeQuorum, "x-delivery-limit": int64(5)})
	require.NoError(t, err)
	pub := testenv.Confirm(t, ch)
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{
			Headers: amqp.Table{
				"__TypeId__":           "com.example.orders.OrderCreated",
				"sluice_poison_reason": "forged by the producer",
				"sluice_event_id":      fmt.Sprint("forged-", i),
				"long":                 strings.Repeat("v", 4096),
			},
			ContentType:   "application/json",
			CorrelationId: fmt.Sprint("corr-", i),
			MessageId:     fmt.Sprint("m", i),
			Type:          "OrderCreated",
			AppId:         "dotnet-orders",
			DeliveryMode:  amqp.Persistent,
			Body:          []byte(strconv.Itoa(i)),
		}
	}
	require.NoError(t, pub.PublishAll(t.Context(), queue, msgs))

	read, err := dlq.Scan(t.Context(), conn, queue, func(*dlq.Message) (bool, error) { return false, nil }, nil)
	require.NoError(t, err)
	require.Equal(t, n, read, "the scan read every message")
	for i, m := range msgs {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		require.True(t, ok, "message %d is back", i)
		require.Equal(t, string(m.Body), string(d.Body), "message %d in its place", i)
		for k, v := range m.Headers {
			require.Equal(t, v, d.Headers[k], "message %d's header %s as published", i, k)
		}
		require.Equal(t, []string{m.ContentType, m.CorrelationId, m.MessageId, m.Type, m.AppId}, []string{d.ContentType, d.CorrelationId, d.MessageId, d.Type, d.AppId}, "message %d's properties as published", i)
	}
}
