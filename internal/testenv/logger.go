package testenv

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
)

// ClosingLogger is a Watermill logger that logs nothing and closes Closing
// when the router logs that it is closing: the moment Router.Close has
// begun, which Router.IsClosed cannot tell (it waits for Close to end). A
// test holds its handlers on a channel and releases them on Closing to have
// work in flight when Close is called, without a sleep.
type ClosingLogger struct {
	watermill.LoggerAdapter
	once    *sync.Once
	Closing chan struct{}
	// Draining is closed when a rabbitmq Consumer logging to the logger
	// has cancelled its consumer as it closes: the broker sends it nothing
	// more (a quorum queue's consumer count does not show it while the
	// consumer holds deliveries).
	Draining chan struct{}
	drained  *sync.Once
}

// NewClosingLogger returns a ClosingLogger whose Closing is open.
func NewClosingLogger() ClosingLogger {
	return ClosingLogger{LoggerAdapter: watermill.NopLogger{}, once: &sync.Once{}, Closing: make(chan struct{}),
		drained: &sync.Once{}, Draining: make(chan struct{})}
}

// Debug closes Draining on the rabbitmq Consumer's "Consumer cancelled"
// line.
func (l ClosingLogger) Debug(msg string, _ watermill.LogFields) {
	if strings.HasPrefix(msg, "Consumer cancelled") {
		l.drained.Do(func() { close(l.Draining) })
	}
}

// Info closes Closing on Watermill's "Closing router" line.
func (l ClosingLogger) Info(msg string, _ watermill.LogFields) {
	if msg == "Closing router" {
		l.once.Do(func() { close(l.Closing) })
	}
}

// With returns l: the fields are not kept.
func (l ClosingLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// CloseMidHandler closes a router whose handlers are held on release, with
// them in flight: it calls stop (which closes the router and its consumer)
// in the background, waits until the router is closing and the draining
// consumer has cancelled on queue (the broker shows no consumer: it sends
// nothing more), releases the handlers, and returns once stop has.
func CloseMidHandler(t testing.TB, closing <-chan struct{}, queue string, release chan struct{}, stop func()) {
	t.Helper()
	stopped := make(chan struct{})
	go func() { defer close(stopped); stop() }()
	<-closing
	conn := AMQP(t)
	require.Eventually(t, func() bool { return QueueConsumers(t, conn, queue) == 0 }, time.Minute, time.Millisecond,
		"the draining consumer cancels: the broker sends it nothing more")
	close(release)
	<-stopped
}
