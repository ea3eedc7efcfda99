// Package bounded runs calls to a dependency whose driver may not honour
// its context (lib/pq toward a black-holed server): each call is waited for
// at most its bound, then given up and left to finish in the background.
// The inbox stage and the outbox's relay run their store calls through it.
// Within bounds a call whose driver honours its context (the console's and
// dlq's store calls); Watch ends a call whose client takes no context
// (internal/amqpcall closes its AMQP connection).
package bounded

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Calls bounds one user's calls. Its zero value is not usable: set Max and
// Timeout. It is safe for concurrent use; do not copy it.
type Calls struct {
	// Max is how many calls given up may go on in the background (each on
	// a goroutine and, on SQL, a connection) before Run stops starting new
	// ones: past it every call fails at once, until some of them return.
	Max int64
	// Grace is how long a call whose context has ended may take to return
	// by itself (a driver that honours its context does at once) before it
	// is given up.
	Grace time.Duration
	// Timeout is wrapped in the error of a call given up.
	Timeout error

	outstanding atomic.Int64
}

// Run runs f on its own goroutine with a context ending after bound (with
// keep, ctx itself: a call that binds what it returns to its context — a
// transaction — must get one that outlives the call), and returns its
// result; when f has not returned Grace after that, it gives f up, returns
// an error wrapping c.Timeout, and leaves f to finish in the background,
// where late (if not nil) receives what f returned — to release what nobody
// will use. gaveUp reports that. A bound ≤ 0 runs f directly, with no bound
// but ctx's. A ctx that has ended already runs nothing: Run returns its
// cause at once — a caller's deadline or shutdown is not a dependency that
// did not answer (Watermill's Retry outside its Timeout hands each retry a
// context the first try's Timeout ended).
func Run[T any](c *Calls, ctx context.Context, bound time.Duration, keep bool, f func(context.Context) (T, error), late func(T, error)) (v T, gaveUp bool, err error) {
	if ctx.Err() != nil {
		return v, false, context.Cause(ctx)
	}
	if bound <= 0 {
		v, err = f(ctx)
		return v, false, err
	}
	if c.outstanding.Load() >= c.Max {
		return v, true, fmt.Errorf("%w: %d earlier calls still outstanding", c.Timeout, c.Max)
	}
	cctx, cancel := context.WithTimeout(ctx, bound)
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	callCtx := cctx
	if keep {
		callCtx = ctx
	}
	go func() {
		v, err := f(callCtx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		cancel()
		return r.v, false, r.err
	case <-cctx.Done():
	}
	grace := time.NewTimer(c.Grace)
	defer grace.Stop()
	select {
	case r := <-done:
		cancel()
		return r.v, false, r.err
	case <-grace.C:
	}
	c.outstanding.Add(1)
	go func() {
		defer c.outstanding.Add(-1)
		r := <-done
		cancel()
		if late != nil {
			late(r.v, r.err)
		}
	}()
	return v, true, fmt.Errorf("%w: no answer within %s", c.Timeout, bound)
}

// Within runs f on the caller's goroutine with ctx ended after d — for a
// dependency whose driver returns by itself once its context ends
// (sluicesql/postgres.Open's pools, go-redis) — and, when d ended it
// (not ctx), says so: what (the call: "reading the outcomes") got no
// answer within d.
func Within(ctx context.Context, d time.Duration, what string, f func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	err := f(cctx)
	if err != nil && errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("%s: no answer within %s: %w", what, d, err)
	}
	return err
}

// ErrNoAnswer is what Watch fires with when its bound passes.
var ErrNoAnswer = errors.New("no answer")

// Watch calls fire once, on a goroutine of its own, when ctx ends (with
// its cause) or d passes (d ≤ 0: ctx only; with an error wrapping
// ErrNoAnswer that names d), until the returned stop is called: for a call
// whose client takes no context, fire ends it (closes its connection).
// stop waits for a fire in progress and returns the reason it fired with,
// nil when it did not.
func Watch(ctx context.Context, d time.Duration, fire func(why error)) (stop func() error) {
	var (
		once sync.Once
		why  error
	)
	do := func(e error) {
		once.Do(func() {
			why = e
			fire(e)
		})
	}
	stopCtx := context.AfterFunc(ctx, func() { do(context.Cause(ctx)) })
	var t *time.Timer
	if d > 0 {
		t = time.AfterFunc(d, func() { do(fmt.Errorf("%w within %s", ErrNoAnswer, d)) })
	}
	return func() error {
		stopCtx()
		if t != nil {
			t.Stop()
		}
		once.Do(func() {}) // waits for a fire in progress; none starts after
		return why
	}
}
