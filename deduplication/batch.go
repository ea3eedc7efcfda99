package deduplication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/sqlstate"
	"github.com/sluicemq/sluice/unitofwork"
)

// batch is one shared unit of work.
type batch struct {
	bt    *batcher
	ready chan struct{} // closed once the unit of work began (or failed to)
	tx    unitofwork.Tx
	sp    unitofwork.Savepointer
	err   error // Begin's

	claimer savepointClaimer // sp, when it is one

	turn    chan struct{} // a token: one delivery at a time uses tx
	next    int           // the next savepoint's number (under turn)
	pending *member       // a kept delivery whose savepoint is not released yet (under turn)

	mu        sync.Mutex // guards the fields below
	admitting bool
	size      int
	keys      map[string]struct{}      // claimed in this batch
	broken    error                    // tx is unusable: a statement given up or a rollback failed
	kept      int                      // deliveries waiting for the commit
	attrs     metric.MeasurementOption // the first kept delivery's handler and queue, for the batch size
	full      chan struct{}            // closed when size reaches MaxBatch

	active    int           // admitted deliveries not done with tx
	idle      chan struct{} // signalled (buffer 1) each time active falls to 0
	done      chan struct{} // closed after the commit or rollback
	commitErr error
}

// member is a delivery that kept its writes in a batch.
type member struct {
	sp, key string
	// err, when set before the batch's done closes, is the delivery's
	// result: its handler left the transaction aborted (found when its
	// savepoint was released with the next delivery's claim).
	err error
}

// join admits the caller into the open batch, or opens one.
func (bt *batcher) join() *batch {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if b := bt.open; b != nil {
		b.mu.Lock()
		if b.admitting {
			b.size++
			b.active++
			if b.size >= bt.cfg.MaxBatch {
				b.admitting = false
				bt.open = nil
				close(b.full)
			}
			b.mu.Unlock()
			return b
		}
		b.mu.Unlock()
	}
	b := &batch{bt: bt, ready: make(chan struct{}), turn: make(chan struct{}, 1), keys: map[string]struct{}{},
		admitting: bt.cfg.MaxBatch > 1, size: 1, active: 1, full: make(chan struct{}), idle: make(chan struct{}, 1), done: make(chan struct{})}
	b.turn <- struct{}{}
	if b.admitting {
		bt.open = b
	} else {
		close(b.full)
	}
	go b.run()
	return b
}

// run begins the unit of work, closes the batch after MaxWait, when full or
// when every delivery it took in is done with the unit of work and none
// waits for its turn (idle: one that comes later would wait for nothing
// but a timer), waits for its deliveries, and commits what they kept.
func (b *batch) run() {
	d := b.bt.d
	// The unit of work outlives every delivery's context: a context of its
	// own, which the SQL store's transaction is bound to.
	tx, err := d.begin(context.Background())
	if err == nil {
		sp, ok := tx.(unitofwork.Savepointer)
		if !ok {
			b.bt.unsupported.Store(true)
			_ = d.rollback(context.Background(), tx)
			err = errNoSavepoints
		}
		b.tx, b.sp = tx, sp
		b.claimer, _ = tx.(savepointClaimer)
	}
	b.err = err
	close(b.ready)

	t := b.bt.timer(b.bt.cfg.MaxWait)
	select {
	case <-t.C:
	case <-b.full:
	case <-b.idleUnlessLinger():
	}
	t.Stop()
	b.bt.mu.Lock()
	b.mu.Lock()
	b.admitting = false
	if b.bt.open == b {
		b.bt.open = nil
	}
	b.mu.Unlock()
	b.bt.mu.Unlock()
	for { // admission is closed: active only falls
		b.mu.Lock()
		n := b.active
		b.mu.Unlock()
		if n == 0 {
			break
		}
		<-b.idle
	}

	defer close(b.done)
	if b.err != nil {
		return
	}
	ctx := context.Background()
	if m := b.pending; m != nil && b.broken == nil {
		b.pending = nil
		if err := b.exec(ctx, func(ctx context.Context) error { return b.sp.Release(ctx, m.sp) }); err != nil {
			b.fail(ctx, m, err)
		}
	}
	switch {
	case b.broken != nil:
		_ = d.rollback(ctx, b.tx)
		b.commitErr = b.broken
	case b.kept == 0:
		_ = d.rollback(ctx, b.tx)
	default:
		if gaveUp, err := d.commit(ctx, b.tx); err != nil {
			if !gaveUp {
				_ = d.rollback(ctx, b.tx)
			}
			b.commitErr = err
		} else {
			d.batchSize.Record(ctx, int64(b.kept), b.attrs) // a failed COMMIT committed nothing
		}
	}
	if b.commitErr != nil {
		b.bt.suspect(slices.Collect(maps.Keys(b.keys)))
	}
}

// idleUnlessLinger is b.idle, or nil (never ready) when the batch lingers.
func (b *batch) idleUnlessLinger() <-chan struct{} {
	if b.bt.cfg.Linger {
		return nil
	}
	return b.idle
}

// exec runs one statement of the shared unit of work within StoreTimeout,
// on a context detached from the delivery's (ctx): a delivery's deadline or
// shutdown must not fail the batch's statements — a rollback to its
// savepoint above all. A statement given up, or one that failed where
// nothing else can go on (a failed rollback to a savepoint), breaks the
// batch.
func (b *batch) exec(ctx context.Context, f func(context.Context) error) error {
	d := b.bt.d
	ctx = endContext(ctx)
	if d.storeBound <= 0 {
		return f(ctx)
	}
	_, gaveUp, err := bounded.Run(d.calls, ctx, d.storeBound, false, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, f(ctx)
	}, nil)
	if gaveUp {
		err = &sluice.DependencyError{Op: "deduplication: savepoint", Err: err}
		b.breakWith(err)
	}
	return err
}

func (b *batch) breakWith(err error) {
	b.mu.Lock()
	if b.broken == nil {
		b.broken = err
	}
	b.mu.Unlock()
}

// undo rolls the shared unit of work back to savepoint sp; a rollback that
// fails leaves nothing to go on with: the batch is broken.
func (b *batch) undo(ctx context.Context, sp string) {
	if err := b.tryUndo(ctx, sp); err != nil {
		b.breakWith(err)
	}
}

func (b *batch) tryUndo(ctx context.Context, sp string) error {
	if err := b.exec(ctx, func(ctx context.Context) error { return b.sp.RollbackTo(ctx, sp) }); err != nil {
		return fmt.Errorf("deduplication: rolling back to a savepoint: %w", err)
	}
	return nil
}

// fail rolls a kept delivery back to its savepoint, because releasing it
// failed with err (its handler left the transaction aborted): it fails as
// Transient, as its commit would have without batching.
func (b *batch) fail(ctx context.Context, m *member, err error) {
	b.undo(ctx, m.sp)
	b.mu.Lock()
	delete(b.keys, m.key)
	b.kept--
	b.mu.Unlock()
	m.err = sluice.Transient(fmt.Errorf("deduplication: commit: %w", err))
}

// savepointAndClaim sets savepoint sp and claims key after it; with a
// savepointClaimer, in one round trip that also releases the savepoint of
// the delivery kept before (b.pending), failing that one if its handler
// left the transaction aborted.
func (b *batch) savepointAndClaim(ctx context.Context, sp, key string) (claimed, gaveUp bool, err error) {
	d := b.bt.d
	if b.claimer == nil {
		if err := b.exec(ctx, func(ctx context.Context) error { return b.sp.Savepoint(ctx, sp) }); err != nil {
			b.breakWith(err)
			return false, true, dependency(ctx, "savepoint", err)
		}
		claimed, gaveUp, err = d.claim(ctx, b.tx, key)
		if err != nil && !gaveUp {
			b.undo(ctx, sp) // a cancelled claim aborted the transaction
		}
		return claimed, gaveUp, err
	}
	prev := b.pending
	b.pending = nil
	release := ""
	if prev != nil {
		release = prev.sp
	}
	claim := func(release string) (claimed, gaveUp bool, err error) {
		// Not on the message's context: a deadline or a shutdown that
		// cancelled the statement could end the batch's connection. And a
		// batched claim never waits: held by another transaction, it fails
		// at once (ErrClaimInProgress) and the delivery leaves the batch to
		// wait alone — a batch waiting on a key while holding others could
		// deadlock with another batch doing the same.
		wait := batchClaimWait
		bound := time.Duration(-1)
		if d.storeBound > 0 {
			bound = wait + d.storeBound
		}
		f := func(c context.Context) (bool, error) {
			return b.claimer.ClaimAfter(c, release, sp, d.cfg.Consumer, key, wait)
		}
		detached := endContext(ctx)
		if bound <= 0 {
			claimed, err = f(detached)
		} else {
			claimed, gaveUp, err = bounded.Run(d.calls, detached, bound, false, f, nil)
		}
		switch {
		case err == nil, errors.Is(err, ErrClaimInProgress), errors.Is(err, unitofwork.ErrAborted):
			return claimed, false, err
		case gaveUp:
			return false, true, &sluice.DependencyError{Op: fmt.Sprintf("deduplication: claim %q", diag.Bound(key, 128)), Err: err}
		}
		return false, false, dependency(ctx, fmt.Sprintf("claim %q", diag.Bound(key, 128)), err)
	}
	claimed, gaveUp, err = claim(release)
	if err != nil && !gaveUp && prev != nil && errors.Is(err, unitofwork.ErrAborted) {
		b.fail(ctx, prev, err) // back at prev's savepoint: before its claim
		claimed, gaveUp, err = claim("")
	}
	if err != nil && !gaveUp {
		// Where did the statement stop? At sp when it was set; otherwise
		// before it, and prev's release is in doubt: prev fails too.
		if b.tryUndo(ctx, sp) != nil && prev != nil && prev.err == nil {
			b.fail(ctx, prev, err)
		}
		return false, false, err
	}
	return claimed, gaveUp, err
}

// lockConflict reports whether err, a batched handler's failure, is a
// deadlock (40P01), a serialization failure (40001) or a lock timeout
// (55P03): what the row locks the batch's other deliveries hold until its
// commit cause — two batches updating hot rows in opposite order deadlock,
// where deliveries one by one would only wait. The delivery runs again
// alone, at once, instead of spending an attempt on the batch's doing.
func lockConflict(err error) bool {
	state, ok := sqlstate.Of(err)
	return ok && (state == "40P01" || state == "40001" || state == "55P03")
}

// commitOfTheBatch reports whether err, the batch's failed commit (rolled
// back), is the batch's and not the database's: anything but an unreachable
// database or a store that did not answer (the brake's to count; a rerun
// would wait on it again). Every kept delivery then runs again alone, at
// once: one whose own writes fail the commit (a deferred constraint) fails
// alone, and its neighbours' attempts are not spent. Running again is safe
// whatever the commit did: a delivery's claim decides (a committed key is a
// duplicate).
func commitOfTheBatch(err error) bool {
	return !sluice.Unreachable(err) && !errors.Is(err, sluice.ErrDependency) && !errors.Is(err, ErrStoreTimeout)
}
