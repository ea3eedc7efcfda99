// Package bounded runs calls to a dependency whose driver may not honour
// its context (lib/pq toward a black-holed server): each call is waited for
// at most its bound, then given up and left to finish in the background.
// The inbox stage and the outbox's relay run their store calls through it.
// Within bounds a call whose driver honours its context (the console's and
// dlq's store calls); Watch ends a call whose client takes no context
// (internal/amqpcall closes its AMQP connection), and WatchProgress one
// whose answer, however long, is given up only when it stops coming.
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
// will use. gaveUp reports that. Past Max calls outstanding, Run starts
// nothing: it gives the call up at once, and late (if not nil) receives
// the zero value and that error, in the background. A bound ≤ 0 runs f
// directly, with no bound but ctx's. A ctx that has ended already runs
// nothing: Run returns its cause at once — a caller's deadline or shutdown
// is not a dependency that did not answer (Watermill's Retry outside its
// Timeout hands each retry a context the first try's Timeout ended).
func Run[T any](c *Calls, ctx context.Context, bound time.Duration, keep bool, f func(context.Context) (T, error), late func(T, error)) (v T, gaveUp bool, err error) {
	if ctx.Err() != nil {
		return v, false, context.Cause(ctx)
	}
	if bound <= 0 {
		v, err = f(ctx)
		return v, false, err
	}
	if c.outstanding.Load() >= c.Max {
		err := fmt.Errorf("%w: %d earlier calls still outstanding", c.Timeout, c.Max)
		if late != nil {
			// Refused, not started, yet given up as far as the caller
			// knows, who leaves late to release what the call held
			// (a transaction): late gets the refusal, in the
			// background — it may wait on the dependency that holds
			// the calls outstanding. One per call refused: as many as
			// the caller's units of work, and counted as the calls.
			c.outstanding.Add(1)
			go func() {
				defer c.outstanding.Add(-1)
				late(v, err)
			}()
		}
		return v, true, err
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
	return WatchProgress(ctx, d, 0, nil, fire)
}

// WatchProgress is Watch for a call whose answer may take long to arrive
// and shows that it is coming: moved tells when the answer last moved (a
// frame of it read). d then bounds the time without progress — d after
// the later of the call's start and the last move — and limit (> 0) the
// whole call, however it moves; the error names which one passed. A nil
// moved is Watch: d bounds the whole call, and limit is not used. It starts
// no goroutine of its own but the timer's, rearmed each time d passes with
// progress since.
func WatchProgress(ctx context.Context, d, limit time.Duration, moved func() time.Time, fire func(why error)) (stop func() error) {
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
	var (
		mu      sync.Mutex // t, stopped: a check does not rearm t once stop stopped it
		t       *time.Timer
		stopped bool
	)
	if d > 0 {
		start := time.Now()
		check := func() {
			mu.Lock()
			if stopped {
				mu.Unlock()
				return
			}
			next, err := expiry(start, time.Now(), d, limit, moved)
			if err == nil {
				t.Reset(next)
				mu.Unlock()
				return
			}
			mu.Unlock()
			do(err)
		}
		mu.Lock()
		t = time.AfterFunc(d, check)
		mu.Unlock()
	}
	return func() error {
		stopCtx()
		mu.Lock()
		stopped = true
		if t != nil {
			t.Stop()
		}
		mu.Unlock()
		once.Do(func() {}) // waits for a fire in progress; none starts after
		return why
	}
}

// expiry says, at now, for a call started at start and bounded as in
// WatchProgress, how long until the next check, or why it is given up.
func expiry(start, now time.Time, d, limit time.Duration, moved func() time.Time) (time.Duration, error) {
	if moved == nil {
		return 0, fmt.Errorf("%w within %s", ErrNoAnswer, d)
	}
	if limit > 0 && !now.Before(start.Add(limit)) {
		return 0, fmt.Errorf("%w within %s, the limit of a call whose answer keeps coming", ErrNoAnswer, limit)
	}
	from, last := start, moved()
	came := last.After(start) // some of the answer came
	if came {
		from = last
	}
	if now.Sub(from) >= d {
		if !came {
			return 0, fmt.Errorf("%w within %s", ErrNoAnswer, d)
		}
		return 0, fmt.Errorf("%w within %s: it stopped coming %s into the call", ErrNoAnswer, d, from.Sub(start).Round(time.Millisecond))
	}
	next := from.Add(d)
	if end := start.Add(limit); limit > 0 && end.Before(next) {
		next = end
	}
	return next.Sub(now), nil
}
