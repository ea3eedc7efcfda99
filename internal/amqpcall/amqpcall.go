// Package amqpcall bounds the waits of calls on an AMQP connection.
// amqp091-go's channel methods (Channel, QueueDeclarePassive, Get, Close)
// and Connection.Close take no context: each waits for the broker's
// answer, which a black-holed broker (the TCP connection up, nothing coming
// back) holds until the heartbeat gives the connection up — three
// heartbeats, 30 s with amqp091-go's default of 10 s — or, on a connection
// without heartbeats (heartbeat=0 in the URL), for ever. Do closes the connection under a call that
// overruns its bound or its context: every call waiting on it returns.
//
// The bound is on the answer's progress, not its size: on a connection
// whose socket Sluice's frame filter reads (internal/amqpframe: every one
// rabbitmq.Dial opens), a call is given up when bound passes with no
// frame read but heartbeats — the broker's connection process sends those
// while a channel's answer is stuck — and at LimitFactor × bound in all,
// however its answer moves. A basic.get of a message near RabbitMQ's
// 128 MiB limit thus arrives over a slow link, and a broker that went
// silent is given up after bound as before. On any other connection
// (amqp.Dial's, a console's Config.Dial that does not use rabbitmq.Dial)
// bound is fixed: it counts the transfer of the answer too.
package amqpcall

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice/internal/amqpframe"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
)

// ErrNoAnswer is wrapped in the error of a call the broker did not answer
// within its bound (bounded.ErrNoAnswer).
var ErrNoAnswer = bounded.ErrNoAnswer

// LimitFactor is how many bounds a call whose answer keeps coming may take
// in all: 5 minutes at dlq's 10 s, in which a message of 128 MiB (RabbitMQ
// 3.x's largest; max_message_size) arrives at 450 KB/s. The limit is there
// for an answer that trickles for ever — frames of other channels on the
// same connection count as progress too — not for a slow link: a read is
// then given up, the connection closed, and the message stays in its queue.
const LimitFactor = 30

// Do runs f, a call on conn that waits for the broker, and closes conn at
// once when ctx ends or bound passes (bound ≤ 0: ctx only) before f
// returns — bound without a frame read from the broker but heartbeats, and
// LimitFactor × bound in all, on a connection Sluice dialed (the package's
// doc); bound in all on any other: f, and every other call waiting on
// conn, then returns. The
// error of a call so given up says what waited ("a passive declare of
// queue orders") and for how long, and wraps ErrNoAnswer, or ctx's cause,
// and f's own error. A ctx that has ended already runs nothing.
//
// Closing the connection returns to their queues the messages its
// channels hold unacknowledged, in no set order on a quorum queue: a
// reader that puts its messages back in order gives Do a ctx that does not
// end under a read (context.Background), and checks its own between two.
func Do[T any](ctx context.Context, conn *amqp.Connection, bound time.Duration, what string, f func() (T, error)) (T, error) {
	var zero T
	if ctx.Err() != nil {
		return zero, fmt.Errorf("%s: %w", what, context.Cause(ctx))
	}
	var moved func() time.Time
	if bound > 0 {
		moved = amqpframe.Progress(conn)
	}
	stop := bounded.WatchProgress(ctx, bound, LimitFactor*bound, moved, func(error) { _ = conn.CloseDeadline(time.Now()) })
	v, err := f()
	if cause := stop(); cause != nil && err != nil {
		if errors.Is(cause, ErrNoAnswer) {
			return zero, fmt.Errorf("%s: the broker gave %w (connection closed): %w", what, cause, err)
		}
		return zero, fmt.Errorf("%s: given up, %w (connection closed): %w", what, cause, err)
	}
	return v, err // answered, if just in time: later calls find conn closed
}

// Run is Do for a call that returns only an error.
func Run(ctx context.Context, conn *amqp.Connection, bound time.Duration, what string, f func() error) error {
	_, err := Do(ctx, conn, bound, what, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// Close closes conn, waiting for the broker's close-ok at most bound and
// not past ctx's end (an ended ctx: not at all): the connection is closed
// either way (Connection.CloseDeadline). A console's Close ends the waits
// of the connections its pages and sampler are closing.
func Close(ctx context.Context, conn *amqp.Connection, bound time.Duration) error {
	if ctx.Err() != nil {
		return conn.CloseDeadline(time.Now())
	}
	stop := bounded.Watch(ctx, 0, func(error) { _ = conn.CloseDeadline(time.Now()) })
	defer func() { _ = stop() }()
	return conn.CloseDeadline(time.Now().Add(bound))
}

// Inspect reads queue's counts with a passive declare on a channel of its
// own (a missing queue closes it): the channel's opening, the declare and
// the channel's close each wait for the broker, all within bound and ctx
// (Do). Its error names the declare and the queue.
func Inspect(ctx context.Context, conn *amqp.Connection, bound time.Duration, queue string) (amqp.Queue, error) {
	return Do(ctx, conn, bound, "a passive declare of "+diag.Printable(queue, 255), func() (amqp.Queue, error) {
		ch, err := conn.Channel()
		if err != nil {
			return amqp.Queue{}, err
		}
		defer func() { _ = ch.Close() }()
		return ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	})
}
