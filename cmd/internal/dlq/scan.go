// Package dlq is the logic of the operator CLI's dlq commands: reading a
// poison queue without losing or reordering anything, selecting messages by
// their diagnosis, replaying them with confirms, archiving them durably, and
// recording an audit line for each run.
package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/poison"
	"github.com/sluicemq/sluice/rabbitmq"
)

// Message is one message of a poison queue with its diagnosis.
type Message struct {
	Delivery   amqp.Delivery
	Msg        *message.Message
	Class      string
	Reason     string
	EventID    string
	EventType  string
	Queue      string // where it was consumed from: the replay target
	Consumer   string
	Attempts   string
	PoisonedAt time.Time // zero when the header is missing or invalid
	TraceID    string
}

func newMessage(d amqp.Delivery) (*Message, error) {
	m, err := rabbitmq.Marshaler{}.Unmarshal(d)
	if err != nil {
		return nil, err
	}
	md := m.Metadata
	at, _ := time.Parse(time.RFC3339Nano, md.Get(poison.PoisonedAtKey))
	return &Message{
		Delivery: d, Msg: m,
		Class: md.Get(poison.ClassKey), Reason: md.Get(poison.ReasonKey),
		EventID: md.Get(sluice.EventIDKey), EventType: md.Get(sluice.EventTypeKey),
		Queue: md.Get(poison.QueueKey), Consumer: md.Get(poison.ConsumerKey),
		Attempts: md.Get(sluice.AttemptKey), PoisonedAt: at, TraceID: md.Get(poison.TraceIDKey),
	}, nil
}

// ErrNoQueue is returned for a queue that does not exist.
var ErrNoQueue = errors.New("dlq: queue does not exist")

// Scan reads the queue's messages, at most as many as it held when the scan
// began, and calls fn with each; fn acks the ones to remove (Message.Ack).
// It never acks by itself: every message fn leaves is returned to the queue
// when Scan ends — and by the broker if the process dies — in its original
// position, marked redelivered. fn returning stop ends the scan early. done,
// when not nil, runs after the last message, while fn's messages can still
// be acked. It returns how many messages it read.
func Scan(ctx context.Context, conn *amqp.Connection, queue string, fn func(*Message) (stop bool, err error), done func() error) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("dlq: opening a channel: %w", err)
	}
	defer func() { _ = ch.Close() }() // returns the unacked messages to the queue
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return 0, fmt.Errorf("%w: %s", ErrNoQueue, diag.Printable(queue, 255))
		}
		return 0, fmt.Errorf("dlq: %s: %w", diag.Printable(queue, 255), err)
	}
	n, err := scan(ctx, ch, queue, q.Messages, fn)
	if err == nil && done != nil {
		err = done()
	}
	return n, err
}

func scan(ctx context.Context, ch *amqp.Channel, queue string, depth int, fn func(*Message) (bool, error)) (int, error) {
	n := 0
	for n < depth {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return n, fmt.Errorf("dlq: reading %s: %w", diag.Printable(queue, 255), err)
		}
		if !ok {
			break
		}
		n++
		m, err := newMessage(d)
		if err != nil {
			return n, err
		}
		stop, err := fn(m)
		if err != nil || stop {
			return n, err
		}
	}
	return n, nil
}

// Ack removes the message from the queue.
func (m *Message) Ack() error { return m.Delivery.Ack(false) }
