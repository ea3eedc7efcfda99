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

// ShutdownGraceConfig configures the ShutdownGrace stage.
type ShutdownGraceConfig struct {
	// Grace is how long a handler in flight may go on after the router
	// begins to close. Keep it under the router's CloseTimeout. Default
	// ShutdownGraceDefault.
	Grace time.Duration
}

// ShutdownGrace returns a stage that lets a handler in flight finish when
// the router closes. Watermill cancels every message's context as soon as
// Close is called, so a handler in the middle of its transaction fails and
// its work is thrown away (safely: it is rolled back and nacked). Behind this
// stage the handler's context is cancelled only grace after the message's
// own context is — time to commit, so the message is acked rather than
// redelivered. Values and deadlines other than the cancellation are kept.
func ShutdownGrace(cfg ShutdownGraceConfig) (message.HandlerMiddleware, error) {
	grace := cfg.Grace
	if grace == 0 {
		grace = ShutdownGraceDefault
	}
	if grace < 0 {
		return nil, fmt.Errorf("middleware: ShutdownGraceConfig.Grace must be positive, got %s", grace)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			orig := msg.Context()
			if orig.Done() == nil { // cannot be cancelled: nothing to shield the handler from
				return h(msg)
			}
			g := &graceState{grace: grace}
			ctx, cancel := context.WithCancelCause(context.WithoutCancel(orig))
			g.cancel = cancel
			if dl, ok := orig.Deadline(); ok {
				var cancelDL context.CancelFunc
				ctx, cancelDL = context.WithDeadline(ctx, dl)
				defer cancelDL()
			}
			stop := context.AfterFunc(orig, g.start)
			defer func() {
				stop()
				g.end()
			}()
			msg.SetContext(ctx)
			defer msg.SetContext(orig)
			return h(msg)
		}
	}, nil
}

// graceState is one delivery's grace period.
type graceState struct {
	grace    time.Duration
	cancel   context.CancelCauseFunc
	mu       sync.Mutex
	timer    *time.Timer
	returned bool
}

// start runs when the router's context ends: the grace period begins.
func (g *graceState) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.returned {
		g.timer = time.AfterFunc(g.grace, func() { g.cancel(ErrShutdownGraceExpired) })
	}
}

// end runs when the handler returned.
func (g *graceState) end() {
	g.mu.Lock()
	g.returned = true
	if g.timer != nil {
		g.timer.Stop()
	}
	g.mu.Unlock()
	g.cancel(nil)
}
