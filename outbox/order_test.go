package outbox_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/embedded"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/outbox"
)

// wrapping is a publisher that wraps another and shows only Publish, as a
// user's decorating publisher does: the relay cannot pipeline it.
type wrapping struct{ message.Publisher }

// Issue 28.10: rows written in order to one topic arrive in order whatever
// the publisher — one without PublishEach (the embedded default, or
// rabbitmq's behind a wrapping publisher) is called one row at a time per
// topic. Before, the relay published one goroutine per row: 29–45 of 200
// out of order on the embedded broker, 5–14 on RabbitMQ.
func TestRowsOfOneTopicArriveInOrderWithAnyPublisher(t *testing.T) {
	t.Parallel()
	const n = 200
	write := func(s *service, topic string) {
		tx, err := s.db.BeginTxx(t.Context(), nil)
		require.NoError(t, err)
		for i := range n {
			require.NoError(t, s.outbox.Write(t.Context(), tx, topic, message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))))
		}
		require.NoError(t, tx.Commit())
	}
	inOrder := func(t *testing.T, got []string) int {
		out := 0
		for i, p := range got {
			if p != strconv.Itoa(i) {
				out++
			}
		}
		return out
	}
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		s := newService(t, testenv.AMQPURL)
		b, err := embedded.New(embedded.Config{Topic: "orders", MaxInFlight: n})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		msgs, err := b.PubSub().Subscribe(ctx, "produced")
		require.NoError(t, err)
		t.Cleanup(func() { cancel(); _ = b.Close() })
		write(s, "produced")
		s.relay(b.PubSub().Publisher(), outbox.RelayConfig{StatsInterval: -1})
		var got []string
		timeout := time.After(2 * time.Minute) // a liveness bound: seconds idle, more while every package runs
		for len(got) < n {
			select {
			case m := <-msgs:
				got = append(got, string(m.Payload))
				m.Ack()
			case <-timeout:
				t.Fatalf("%d of %d delivered", len(got), n)
			}
		}
		require.Zero(t, inOrder(t, got), "out of order: %v", got)
	})
	t.Run("rabbitmq behind a wrapping publisher", func(t *testing.T) {
		t.Parallel()
		s := newService(t, testenv.AMQPURL)
		write(s, s.produced)
		s.relay(wrapping{s.rabbit.Publisher()}, outbox.RelayConfig{StatsInterval: -1})
		var got []string
		for _, d := range s.producedMessages(n) {
			got = append(got, string(d.Body))
		}
		require.Zero(t, inOrder(t, got), "out of order: %v", got)
	})
}
