package rabbitmq

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// A confirm the client already received — waiting in the buffer between
// amqp091 and listen — when the confirm timeout passes counts: the publish
// is confirmed, not uncertain (and sent again by the outbox's relay).
// Fault injected: the channel's confirms are fed by the test, which cannot
// make the broker answer at the exact moment a timer fires.
func TestAConfirmAlreadyReceivedWhenTheTimeoutPassesCounts(t *testing.T) {
	for range 200 {
		c := &confirmChannel{
			returns:  make(chan amqp.Return),
			confirms: make(chan amqp.Confirmation, 4),
			closes:   make(chan *amqp.Error, 1),
			settles:  make(chan chan struct{}),
			done:     make(chan struct{}),
			pending:  map[uint64]*inflight{},
		}
		f := &inflight{c: c, tag: 1, done: make(chan struct{})}
		c.pending[1] = f
		c.confirms <- amqp.Confirmation{DeliveryTag: 1, Ack: true}
		errc := make(chan error, 1)
		go func() { errc <- f.wait(context.Background(), alreadyExpired) }()
		go c.listen()
		require.NoError(t, <-errc, "confirmed before the wait gave up")
		close(c.confirms)
		<-c.done
	}
}
