package dlq_test

import (
	"strconv"
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
