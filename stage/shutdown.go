package stage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// shutdownGraceDefault is how long a handler in flight may go on after the
// router begins to close.
const shutdownGraceDefault = 10 * time.Second

// ErrShutdownGraceExpired is the cause of a handler context cancelled
// because the shutdown grace ran out.
var ErrShutdownGraceExpired = errors.New("middleware: shutdown grace period expired")

// ShutdownGrace returns a stage that lets a handler in flight finish when
// the router closes, for grace: how long a handler in flight may go on
// after the router begins to close (keep it under the router's
// CloseTimeout; zero is the default, 10 s; negative is refused). Watermill cancels every message's context as soon as
// Close is called, so a handler in the middle of its transaction fails and
// its work is thrown away (safely: it is rolled back and nacked). Behind this
// stage the handler's context is cancelled only grace after the message's
// own context is — time to commit, so the message is acked rather than
// redelivered. Values and deadlines other than the cancellation are kept.
// Once the handler has returned nothing cancels its context but orig's
// deadline: the messages it produced carry it to Watermill's publish.
func ShutdownGrace(grace time.Duration) (message.HandlerMiddleware, error) {
	grace = cmp.Or(grace, shutdownGraceDefault)
	if grace < 0 {
		return nil, fmt.Errorf("middleware: ShutdownGrace's grace must be positive, got %s", grace)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			orig := msg.Context()
			g := &graceCtx{orig: orig, grace: grace}
			msg.SetContext(g)
			defer msg.SetContext(orig)
			defer g.end()
			return h(msg)
		}
	}, nil
}

// graceCtx is the handler's context behind ShutdownGrace: orig's values and
// deadline, cancelled only grace after orig is. It arms itself — a cancel
// context of its own and a watch on orig — the first time the handler (or
// its database driver) looks at Done, or at Err once orig ended; a second
// Err while orig is live sets only the watch, which notes when orig ends:
// a handler that never looks pays one small allocation and no registration
// with orig. The grace period begins when orig is cancelled, or, for a
// handler that first looks after that, when it first looks.
type graceCtx struct {
	orig  context.Context
	grace time.Duration

	armed atomic.Pointer[context.Context] // the inner context, once armed; set under mu
	looks atomic.Int32                    // Err's looks while orig was live

	mu       sync.Mutex
	cancel   context.CancelCauseFunc
	stopOrig func() bool // the watch on orig, once set
	origEnd  time.Time   // when orig ended, if the watch saw it before the context was armed
	timer    *time.Timer
	returned bool
}

func (g *graceCtx) Deadline() (time.Time, bool) { return g.orig.Deadline() }
func (g *graceCtx) Done() <-chan struct{}       { return g.arm().Done() }

// Err is nil while orig is live, without arming: nothing waits on a
// channel then. The first such look is free (the inbox asks it of every
// delivery before its store); a second sets the watch on orig (6
// allocations), so that a handler that looked while orig was live, and
// next looks after orig ended, gets the grace from orig's end, not from
// that look. Once orig ended it arms, as Done does.
func (g *graceCtx) Err() error {
	if inner := g.armed.Load(); inner != nil {
		return (*inner).Err()
	}
	if g.orig.Err() == nil {
		if g.looks.Add(1) == 2 { // the second look, once
			g.watch()
		}
		return nil
	}
	return g.armLocked().Err()
}

// watch sets the watch on orig, once, while the handler runs.
func (g *graceCtx) watch() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopOrig == nil && !g.returned {
		g.stopOrig = context.AfterFunc(g.orig, g.start)
	}
}

// arm returns the armed inner context, arming it on the first call.
func (g *graceCtx) arm() context.Context {
	if inner := g.armed.Load(); inner != nil {
		return *inner
	}
	return g.armLocked()
}

// Value is orig's value. The context package finds a context's own
// cancellation (context.Cause) through Value with an unexported *int key:
// such a lookup arms the context, so that it finds this one's, not orig's.
func (g *graceCtx) Value(key any) any {
	if inner := g.armed.Load(); inner != nil {
		return (*inner).Value(key)
	}
	if _, ok := key.(*int); !ok {
		return g.orig.Value(key)
	}
	return g.arm().Value(key)
}

// armLocked creates the cancel context and the watch on orig, once.
func (g *graceCtx) armLocked() context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	if inner := g.armed.Load(); inner != nil {
		return *inner
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(g.orig))
	g.cancel = cancel
	if dl, ok := g.orig.Deadline(); ok {
		var cancelDL context.CancelFunc
		ctx, cancelDL = context.WithDeadline(ctx, dl)
		g.cancel = func(cause error) { cancel(cause); cancelDL() }
	}
	g.armed.Store(&ctx)
	if g.returned { // first looked at after the handler returned: nothing ends it now
		return ctx
	}
	switch {
	case g.stopOrig == nil:
		g.stopOrig = context.AfterFunc(g.orig, g.start)
	case !g.origEnd.IsZero(): // the watch saw orig end: the grace began then
		g.startLocked(g.grace - time.Since(g.origEnd))
	}
	return ctx
}

// start runs when orig ends: the grace period begins (armed), or its
// beginning is noted (not yet: armLocked starts what is left of it).
func (g *graceCtx) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancel == nil {
		g.origEnd = time.Now()
		return
	}
	g.startLocked(g.grace)
}

// startLocked ends the armed context after d, once; at once when d is
// spent (the grace ran out before the handler looked again).
func (g *graceCtx) startLocked(d time.Duration) {
	switch {
	case g.returned || g.timer != nil:
	case d <= 0:
		g.cancel(ErrShutdownGraceExpired)
	default:
		g.timer = time.AfterFunc(d, func() { g.cancel(ErrShutdownGraceExpired) })
	}
}

// end runs when the handler returned. It stops the watch on orig and the
// grace timer but does not cancel the context: the messages the handler
// produced may carry it (evt.SetContext(ctx)), and Watermill publishes them
// after the whole stack returned — a context cancelled here made every such
// publish fail ("context canceled"), the delivery nacked and its redelivery a
// duplicate whose produced messages were never published. A deadline of
// orig's still ends it; nothing else is left running.
func (g *graceCtx) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.returned = true
	if g.stopOrig != nil {
		g.stopOrig()
	}
	if g.timer != nil {
		g.timer.Stop()
	}
}
