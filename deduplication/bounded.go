package deduplication

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrStoreTimeout is matched by the error of a store call (Begin, Claim,
// Commit, Rollback) that did not return within its bound: a store that does
// not answer, as a black-holed database does. It comes wrapped in a
// *sluice.DependencyError, so brake.MatchUnreachable counts it.
var ErrStoreTimeout = errors.New("deduplication: the store did not answer in time")

// abandonedMax is how many store calls that outlived their bound a stage
// lets go on in the background (each on a goroutine and, on SQL, a
// connection) before it stops starting new ones: past it every call fails at
// once with ErrStoreTimeout, until some of them return.
const abandonedMax = 64

// abandonGrace is how long a call whose context has ended may take to return
// by itself (a driver that honours its context does at once) before it is
// given up.
const abandonGrace = 100 * time.Millisecond

// bounded runs f on its own goroutine with a context ending after bound
// (with keep, ctx itself: Begin binds its unit of work to the context it is
// given, which must outlive the call), and returns its result; when f has not returned abandonGrace after that, it
// gives f up, returns ErrStoreTimeout, and leaves f to finish in the
// background, where late (if not nil) receives what f returned — to roll
// back a unit of work nobody will use. gaveUp reports that. A bound ≤ 0 runs
// f directly, with no bound but ctx's.
func bounded[T any](abandoned *atomic.Int64, ctx context.Context, bound time.Duration, keep bool, f func(context.Context) (T, error), late func(T, error)) (v T, gaveUp bool, err error) {
	if bound <= 0 {
		v, err = f(ctx)
		return v, false, err
	}
	if abandoned.Load() >= abandonedMax {
		return v, true, fmt.Errorf("%w: %d earlier calls still outstanding", ErrStoreTimeout, abandonedMax)
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
	grace := time.NewTimer(abandonGrace)
	defer grace.Stop()
	select {
	case r := <-done:
		cancel()
		return r.v, false, r.err
	case <-grace.C:
	}
	abandoned.Add(1)
	go func() {
		defer abandoned.Add(-1)
		r := <-done
		cancel()
		if late != nil {
			late(r.v, r.err)
		}
	}()
	return v, true, fmt.Errorf("%w: no answer within %s", ErrStoreTimeout, bound)
}
