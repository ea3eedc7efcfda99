package stage

import (
	"cmp"
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice"
)

// recovererClassDefault is the class given to a recovered panic.
const recovererClassDefault = sluice.ClassInvariant

// RecovererConfig configures the Recoverer middleware.
type RecovererConfig struct {
	// sluice.Class is given to the recovered panic. Must be valid and not
	// sluice.ClassRejected. Default sluice.ClassInvariant.
	Class sluice.Class
}

// withDefaults returns a copy of c with its defaults filled.
func (c RecovererConfig) withDefaults() RecovererConfig {
	c.Class = cmp.Or(c.Class, recovererClassDefault)
	return c
}

// Recoverer returns a middleware that turns a handler panic (or a
// runtime.Goexit) into a *sluice.Failure of the configured class wrapping a
// *sluice.PanicError that carries the stack. Messages produced before the panic are
// dropped. Safe for concurrent use.
func Recoverer(cfg RecovererConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	class := cfg.Class
	if !class.Valid() || class == sluice.ClassRejected {
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
				stack := debug.Stack()
				err = &sluice.Failure{Class: class, Err: &sluice.PanicError{Value: r, Stack: stack}}
				sluice.Record(msg.Context(), func(r *sluice.Report) { r.Panic, r.Stack = true, string(stack) })
			}()
			produced, err = h(msg)
			returned = true
			return produced, err
		}
	}, nil
}
