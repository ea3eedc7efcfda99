package middleware

import (
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill/message"
)

// RecovererClassDefault is the class given to a recovered panic.
const RecovererClassDefault = ClassInvariant

// PanicError is a panic recovered from a handler. Error() gives the panic
// value only; Stack holds the goroutine's stack at the panic, for logs and
// the poison diagnosis.
type PanicError struct {
	Value any
	Stack []byte
}

// Error returns "panic: <value>".
func (p *PanicError) Error() string { return fmt.Sprintf("panic: %v", p.Value) }

// Unwrap returns the panic value when it was an error, so errors.Is/As can
// match a panic(err).
func (p *PanicError) Unwrap() error {
	if err, ok := p.Value.(error); ok {
		return err
	}
	return nil
}

// RecovererConfig configures the Recoverer middleware.
type RecovererConfig struct {
	// Class is given to the recovered panic. Must be valid and not
	// ClassRejected. Default RecovererClassDefault (Invariant).
	Class Class
}

// Recoverer returns a middleware that turns a handler panic (or a
// runtime.Goexit) into a *Failure of the configured class wrapping a
// *PanicError that carries the stack. Messages produced before the panic are
// dropped. Safe for concurrent use.
func Recoverer(cfg RecovererConfig) (message.HandlerMiddleware, error) {
	class := cfg.Class
	if class == Unclassified {
		class = RecovererClassDefault
	}
	if !class.Valid() || class == ClassRejected {
		return nil, fmt.Errorf("middleware: RecovererConfig.Class must be transient, poison, invariant or exhausted, got %s", class)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) (produced []*message.Message, err error) {
			returned := false
			defer func() {
				if returned {
					return
				}
				r := recover()
				if r == nil {
					r = "handler exited without returning (runtime.Goexit)"
				}
				produced = nil
				err = &Failure{Class: class, Err: &PanicError{Value: r, Stack: debug.Stack()}}
				Record(msg.Context(), func(r *Report) { r.Panic = true })
			}()
			produced, err = h(msg)
			returned = true
			return produced, err
		}
	}, nil
}
