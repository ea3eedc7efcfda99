package rabbitmq_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// unpublishable are messages RabbitMQ would refuse by closing the channel
// (a CC or BCC header that is not an array, a body over max_message_size)
// or that a consumer with Sluice's client could not read (more headers
// than HeadersMaxEntries), or that the client cannot encode (a header name
// over 255 bytes), by the error each matches.
func unpublishable() map[string]struct {
	msg *message.Message
	err error
} {
	withHeader := func(k, v string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		m.Metadata.Set(k, v)
		return m
	}
	many := message.NewMessage(watermill.NewUUID(), []byte("x"))
	for i := range rabbitmq.HeadersMaxEntries + 1 {
		many.Metadata.Set(fmt.Sprint("h", i), "v")
	}
	return map[string]struct {
		msg *message.Message
		err error
	}{
		"CC":               {withHeader("CC", "other-queue"), rabbitmq.ErrRoutingHeader},
		"BCC":              {withHeader("BCC", "other-queue"), rabbitmq.ErrRoutingHeader},
		"header name":      {withHeader(strings.Repeat("k", 256), "v"), broker.ErrNameTooLong},
		"too many headers": {many, rabbitmq.ErrTooManyHeaders},
		"body":             {message.NewMessage(watermill.NewUUID(), make([]byte, 64<<10+1)), rabbitmq.ErrMessageTooLarge},
	}
}

// A message the broker would refuse by closing the channel is refused by
// the Publisher before it is sent, so the messages pipelined beside it on
// the channel are confirmed; CheckPublish tells the same without
// publishing (what the outbox asks when it writes).
func TestPublisherRefusesWhatTheBrokerWouldCloseTheChannelFor(t *testing.T) {
	t.Parallel()
	q := declareQueue(t, "refuse")
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: testenv.AMQPURL, MaxMessageSize: 64 << 10},
		ConfirmTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	sent := 0
	for name, c := range unpublishable() {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, p.CheckPublish(q, c.msg), c.err)
			require.ErrorIs(t, p.CheckPublish(q, c.msg), sluice.ErrUnpublishable)
			if name == "too many headers" {
				return // the broker carries it; Sluice's consumers cannot read it
			}
			batch := msgs(3)
			batch[1] = c.msg
			errs := p.PublishEach(q, batch...)
			require.ErrorIs(t, errs[1], c.err)
			require.ErrorIs(t, errs[1], sluice.ErrUnpublishable)
			require.NoError(t, errs[0])
			require.NoError(t, errs[2], "the message after the refused one is confirmed: the channel stayed open")
			sent += 2
		})
	}
	require.Equal(t, sent, testenv.QueueDepth(t, testenv.AMQP(t), q))
	ok := message.NewMessage(watermill.NewUUID(), make([]byte, 64<<10))
	ok.Metadata.Set("CC-not", "v")
	require.NoError(t, p.CheckPublish(q, ok), "a body at the limit, an ordinary header")
	require.ErrorIs(t, p.CheckPublish(strings.Repeat("q", 256), ok), broker.ErrNameTooLong)
}
