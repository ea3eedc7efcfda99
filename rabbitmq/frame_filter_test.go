package rabbitmq_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Issue 42. The two watermill-amqp paths — BrokerConfig.WatermillSubscriber's, and a
// watermill-amqp Config of the user's given to rabbitmq.WithMarshaler —
// read through Sluice's frame filter: behind one message whose headers
// upstream amqp091-go refuses (each hostile shape), the 20 good messages
// are delivered once each, the hostile one reaches the subscriber's
// consumer with no header of its producer's and metakeys.HeadersError set to
// the reason, and the subscriber connects once (no FRAME_ERROR, no
// reconnect). Before, watermill-amqp's connection went through upstream's
// client unfiltered: 0 of the 20 in 30 s, thousands of reconnects.
func TestWatermillSubscribersReadHostileHeadersThroughTheFilter(t *testing.T) {
	t.Parallel()
	paths := []struct {
		name string
		sub  func(t *testing.T, log watermill.LoggerAdapter) message.Subscriber
	}{
		{"WatermillSubscriber", func(t *testing.T, log watermill.LoggerAdapter) message.Subscriber {
			sub, err := rabbitmq.NewWatermillSubscriber(rabbitmq.Connection{URL: testenv.AMQPURL, Logger: log})
			require.NoError(t, err)
			return sub
		}},
		{"WithMarshaler", func(t *testing.T, log watermill.LoggerAdapter) message.Subscriber {
			cfg, err := rabbitmq.WithMarshaler(wamqp.NewDurableQueueConfig(testenv.AMQPURL))
			require.NoError(t, err)
			sub, err := wamqp.NewSubscriber(cfg, log)
			require.NoError(t, err)
			return sub
		}},
	}
	for _, p := range paths {
		for _, h := range hostileHeaders() {
			t.Run(p.name+"/"+h.name, func(t *testing.T) {
				t.Parallel()
				queue := testenv.Name("filter_" + h.name)
				testenv.DeleteQueuesNowAndAtEnd(t, queue)
				conn := testenv.AMQP(t)
				_, err := testenv.Channel(t, conn).QueueDeclare(queue, true, false, false, false, nil)
				require.NoError(t, err)
				publishRaw(t, conn, queue, amqp.Publishing{Headers: h.headers, MessageId: "hostile", Body: []byte("hostile")})
				const good = 20
				for i := range good {
					publishRaw(t, conn, queue, amqp.Publishing{Headers: amqp.Table{"n": int32(i)}, MessageId: fmt.Sprint("good-", i), Body: []byte("good")})
				}

				log := testenv.NewLog()
				sub := p.sub(t, log)
				t.Cleanup(func() { require.NoError(t, sub.Close()) })
				msgs, err := sub.Subscribe(t.Context(), queue)
				require.NoError(t, err)
				seen := map[string]int{}
				for range good + 1 {
					select {
					case m := <-msgs:
						seen[m.UUID]++
						if m.UUID == "hostile" {
							require.Contains(t, m.Metadata.Get(metakeys.HeadersError), h.reason)
							for k := range h.headers {
								require.NotContains(t, m.Metadata, k, "no header of the unreadable table")
							}
						} else {
							require.Empty(t, m.Metadata.Get(metakeys.HeadersError))
							require.NotEmpty(t, m.Metadata.Get("n"), "a good message's headers kept")
						}
						m.Ack()
					case <-time.After(time.Minute):
						require.FailNow(t, "the queue stalled", "%d of %d messages in a minute; %d reconnects", len(seen), good+1,
							len(log.Lines("reconnecting")))
					}
				}
				require.Len(t, seen, good+1)
				for id, n := range seen {
					require.Equal(t, 1, n, id)
				}
				require.Len(t, log.Lines("Connected to AMQP"), 1, "one connection, no reconnect")
				require.Empty(t, log.Lines("reconnecting"))
				require.Eventually(t, func() bool { return testenv.QueueDepth(t, conn, queue) == 0 }, time.Minute, 10*time.Millisecond)
			})
		}
	}
}
