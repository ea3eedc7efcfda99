package rabbitmq

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
)

// A Consumer that closes gives back what it holds in the order it came:
// first what it handed out and is nacked as it closes (an ordered
// handler's view gives a key's waiting deliveries back then, one after
// another), then what the broker sent that no handler took. A quorum queue
// redelivers returns in the order they reach it, ahead of the rest: a
// delivery no handler took, returned first, would overtake the ones the
// view gives back — the next consumer would apply a key's later event
// before its earlier ones. (Before, the Consumer returned it at once, as
// its close began: evt-2 came back before evt-1.)
func TestAClosingConsumerReturnsWhatNoHandlerTookAfterWhatItHandedOut(t *testing.T) {
	t.Parallel()
	queue := testenv.Name("close_order")
	testenv.DeleteQueuesAtEnd(t, queue)
	conn := testenv.AMQP(t)
	ch := testenv.Channel(t, conn)
	_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, ch.PublishWithContext(t.Context(), "", queue, false, false,
			amqp.Publishing{Headers: amqp.Table{sluice.EventIDKey: fmt.Sprint("evt-", i)}}))
	}

	c, err := NewConsumer(ConsumerConfig{Connection: Connection{URL: testenv.AMQPURL}, Prefetch: 2, DrainTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	out, err := c.Subscribe(t.Context(), queue)
	require.NoError(t, err)
	first, second := <-out, <-out
	require.Equal(t, []string{"evt-0", "evt-1"}, []string{first.Metadata.Get(sluice.EventIDKey), second.Metadata.Get(sluice.EventIDKey)})
	first.Ack()
	// evt-2 is sent once evt-0's ack is in; the Consumer holds it, no
	// handler takes it.
	require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == 0 }, time.Minute, 5*time.Millisecond, "evt-2 sent to the Consumer")
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	<-c.closing   // (a quorum queue counts a cancelled consumer until what it holds is settled)
	second.Nack() // given back as the Consumer closes
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Close not back in a minute")
	}

	var got []string
	require.Eventually(t, func() bool {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if ok {
			got = append(got, fmt.Sprint(d.Headers[sluice.EventIDKey]))
		}
		return len(got) == 2
	}, time.Minute, 5*time.Millisecond)
	require.Equal(t, []string{"evt-1", "evt-2"}, got, "the order the queue gives them back in")
}
