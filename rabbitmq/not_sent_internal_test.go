package rabbitmq

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/testenv"
)

// A message the client could not send because the broker had closed the
// channel over an earlier publish (the culprit: here a publish to an
// exchange that does not exist, 404) is refused with it: not stored, not
// uncertain — as a message sent after the culprit is. Before, it failed
// with amqp091's "504 channel/connection is not open" alone, and
// rabbitmq.TestAMessageTheBrokerClosesTheChannelOnIsRefused failed so under
// load, when the broker's close came before the client sent the message
// after the culprit. Here the close comes first by construction.
func TestAMessageNotSentAfterTheCulpritIsRefusedWithIt(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(testenv.AMQPURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c, err := newConfirmChannel(t.Context(), conn, 10*time.Second, 0)
	require.NoError(t, err)
	pub := func() amqp.Publishing { return amqp.Publishing{Headers: amqp.Table{}, Body: []byte("x")} }

	f, err := c.publish(testenv.Name("missing_exchange"), "k", pub())
	require.NoError(t, err, "sent")
	err = f.wait(context.Background(), nil)
	require.ErrorIs(t, err, ErrRefused, "the culprit: %v", err)
	select { // the channel closed, its reason recorded
	case <-c.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the channel did not close after the culprit")
	}

	_, err = c.publish("", testenv.Name("after_the_culprit"), pub())
	require.ErrorIs(t, err, ErrRefused, "not sent, after the culprit: %v", err)
	require.ErrorIs(t, err, ErrChannelClosed)
	require.ErrorIs(t, err, amqp.ErrClosed, "the client's own reason is kept")
	require.NotErrorIs(t, err, sluice.ErrPublishUncertain)
}
