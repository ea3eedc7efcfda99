package rabbitmq_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Issue 43, item 6: a message the broker refuses by closing the channel —
// 406 PRECONDITION_FAILED, over its max_message_size, which a publisher
// told a larger limit sends — is refused, not uncertain: the broker
// discards what follows a channel exception, so the last publish sent is
// not stored. Before, it was labelled "the publish is uncertain: the
// message may be stored". The publishes before it that awaited their
// confirms stay uncertain: the culprit cannot be told among them. On a
// private node whose max_message_size is 1 MiB (configuredNode).
func TestAMessageTheBrokerClosesTheChannelOnIsRefused(t *testing.T) {
	t.Parallel()
	node, _ := configuredNodeFor(t)
	conn, err := rabbitmq.Dial(rabbitmq.Connection{URL: node.URL}, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	q := testenv.Name("refused")
	_, err = ch.QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Connection: rabbitmq.Connection{URL: node.URL, MaxMessageSize: 64 << 20},
		ConfirmTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	big := func() *message.Message { return message.NewMessage(watermill.NewUUID(), make([]byte, 2<<20)) }

	err = p.Publish(q, big())
	require.ErrorIs(t, err, rabbitmq.ErrRefused, "alone: %v", err)
	require.ErrorIs(t, err, rabbitmq.ErrChannelClosed)
	require.NotErrorIs(t, err, sluice.ErrPublishUncertain)
	require.ErrorContains(t, err, "406")
	require.NotContains(t, err.Error(), "may be stored")

	// Pipelined: the message after the culprit is refused with it (it was
	// discarded, or not sent once the broker's close had come); the culprit
	// is uncertain when the message after it was sent (it was not the last
	// sent), refused when that one was not (it was the last sent). Either
	// way it is never taken as stored.
	batch := msgs(3)
	batch[1] = big()
	errs := p.PublishEach(q, batch...)
	require.ErrorIs(t, errs[2], rabbitmq.ErrRefused, "%v", errs)
	require.NotErrorIs(t, errs[2], sluice.ErrPublishUncertain)
	if !errors.Is(errs[1], rabbitmq.ErrRefused) {
		require.ErrorIs(t, errs[1], sluice.ErrPublishUncertain, "%v", errs)
	}
	if errs[0] != nil {
		require.ErrorIs(t, errs[0], sluice.ErrPublishUncertain, "before the culprit: confirmed or uncertain")
	}
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	require.NoError(t, err)
	require.LessOrEqual(t, info.Messages, 1, "at most the message before the culprit is stored")
}
