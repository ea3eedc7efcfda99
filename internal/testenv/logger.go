package testenv

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill"
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
}

// NewClosingLogger returns a ClosingLogger whose Closing is open.
func NewClosingLogger() ClosingLogger {
	return ClosingLogger{LoggerAdapter: watermill.NopLogger{}, once: &sync.Once{}, Closing: make(chan struct{})}
}

// Info closes Closing on Watermill's "Closing router" line.
func (l ClosingLogger) Info(msg string, _ watermill.LogFields) {
	if msg == "Closing router" {
		l.once.Do(func() { close(l.Closing) })
	}
}

// With returns l: the fields are not kept.
func (l ClosingLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }
