package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ShutdownGraceDefault is how long a handler in flight may go on after the
// router begins to close.
const ShutdownGraceDefault = 10 * time.Second

// ErrShutdownGraceExpired is the cause of a handler context cancelled
// because the shutdown grace ran out.
var ErrShutdownGraceExpired = errors.New("middleware: shutdown grace period expired")

// ShutdownGrace returns a stage that lets a handler in flight finish when
// the router closes. Watermill cancels every message's context as soon as
// Close is called, so a handler in the middle of its transaction fails and
// its work is thrown away (safely: it is rolled back and nacked). Behind this
// stage the handler's context is cancelled only grace after the message's
// own context is — time to commit, so the message is acked rather than
// redelivered. Keep grace under the router's CloseTimeout. Values and
// deadlines other than the cancellation are kept.
func ShutdownGrace(grace time.Duration) (message.HandlerMiddleware, error) {
	if grace <= 0 {
		return nil, fmt.Errorf("middleware: shutdown grace must be positive, got %s", grace)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			orig := msg.Context()
			ctx, cancel := context.WithCancelCause(context.WithoutCancel(orig))
			if dl, ok := orig.Deadline(); ok {
				var cancelDL context.CancelFunc
				ctx, cancelDL = context.WithDeadline(ctx, dl)
				defer cancelDL()
			}
			var (
				mu       sync.Mutex
				timer    *time.Timer
				returned bool
			)
			stop := context.AfterFunc(orig, func() {
				mu.Lock()
				defer mu.Unlock()
				if !returned {
					timer = time.AfterFunc(grace, func() { cancel(ErrShutdownGraceExpired) })
				}
			})
			defer func() {
				stop()
				mu.Lock()
				returned = true
				if timer != nil {
					timer.Stop()
				}
				mu.Unlock()
				cancel(nil)
			}()
			msg.SetContext(ctx)
			defer msg.SetContext(orig)
			return h(msg)
		}
	}, nil
}
