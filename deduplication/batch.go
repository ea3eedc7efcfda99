package deduplication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/sqlstate"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Defaults of BatchConfig (group commit).
const (
	// MaxBatchDefault is BatchConfig.MaxBatch's default: the most
	// deliveries one commit takes.
	MaxBatchDefault = 8
	// MaxWaitDefault is BatchConfig.MaxWait's default: the longest a batch
	// waits for more deliveries after its first.
	MaxWaitDefault = 2 * time.Millisecond
)

// queueTimeoutDefault is BatchConfig.QueueTimeout's default.
const queueTimeoutDefault = 50 * time.Millisecond

// BatchConfig turns on group commit (Config.Batch): deliveries in flight on
// one handler share one transaction. Each one's claim and handler run inside
// a SAVEPOINT of their own, one delivery after another on the shared
// transaction; the transaction commits once; each delivery returns — is
// acked — only after that commit. A delivery that fails rolls back to its
// savepoint (its claim and writes vanish; its error goes outward as without
// batching) and returns at once; the others commit. A failed commit fails
// every delivery that waited for it as Transient. The handler's API does not
// change: TxFromContext (sqlstore.TxFromContext) gives the shared
// transaction, positioned at the delivery's savepoint.
//
// A store whose units of work are not Savepointers (Redis, MemoryStore)
// runs one unit of work per delivery, as without batching.
type BatchConfig struct {
	// MaxBatch is the most deliveries one transaction commits. A batch's
	// deliveries run one after another on one connection, so the batches of
	// a handler run side by side only when more deliveries are in flight
	// than one batch takes: give the consumer a prefetch of several times
	// MaxBatch (rabbitmq.BrokerConfig.Prefetch; docs/benchmarks.md, P8).
	// Default MaxBatchDefault.
	MaxBatch int
	// MaxWait is the longest a batch takes in deliveries after its first.
	// A batch closes sooner when it is full, or — unless Linger — when
	// every delivery it took in is done and none waits for its turn: a lone
	// delivery commits once its handler returned, and a batch carries the
	// deliveries that arrived while the ones before them ran. Default
	// MaxWaitDefault.
	MaxWait time.Duration
	// Linger keeps a batch taking in deliveries for the whole MaxWait, even
	// once the ones it took in are done: fewer, larger commits when
	// deliveries trickle in, each delivery waiting up to MaxWait for
	// company before its commit.
	Linger bool
	// QueueTimeout bounds how long a delivery waits for its turn in a batch
	// (the handler before it still running): past it, it leaves the batch
	// and runs in a unit of work of its own. A slow handler so holds up only
	// the deliveries that ran before it in its batch (their commit waits for
	// it: bound it with the handler's own deadline), never those queued
	// after it. Default 50 ms.
	QueueTimeout time.Duration
}

func (c BatchConfig) withDefaults() BatchConfig {
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.MaxWait = cmp.Or(c.MaxWait, MaxWaitDefault)
	c.QueueTimeout = cmp.Or(c.QueueTimeout, queueTimeoutDefault)
	return c
}

func (c BatchConfig) validate() error {
	switch {
	case c.MaxBatch < 1 || c.MaxBatch > 1000:
		return fmt.Errorf("deduplication: Config.Batch.MaxBatch must be between 1 and 1000, got %d", c.MaxBatch)
	case c.MaxWait < 0 || c.MaxWait > time.Second:
		return fmt.Errorf("deduplication: Config.Batch.MaxWait must be between 0 and 1s, got %s", c.MaxWait)
	case c.QueueTimeout < 0:
		return fmt.Errorf("deduplication: Config.Batch.QueueTimeout must not be negative, got %s", c.QueueTimeout)
	}
	return nil
}

// Savepointer is implemented by a Tx that can mark a point in itself and
// undo what followed it: the SQL store's, which group commit needs. name is
// an SQL identifier the inbox generates. Release fails with an error
// matching ErrAborted when an earlier statement aborted the transaction.
type Savepointer interface {
	Savepoint(ctx context.Context, name string) error
	RollbackTo(ctx context.Context, name string) error
	Release(ctx context.Context, name string) error
}

// SavepointClaimer is a Savepointer that can, in one round trip, release
// the savepoint of the delivery before (release, "" for none), set the
// next delivery's savepoint and claim its key after it: the SQL store on
// lib/pq. Group commit uses it where the store offers it, and then releases
// a successful delivery's savepoint together with the next one's claim.
// When the transaction was aborted before the call (by the handler of the
// delivery before), its error matches ErrAborted and nothing was done.
//
// wait bounds the claim's wait for a concurrent claim of the same key
// (ClaimTimeout; 0: none) — where the store can, without cancelling ctx, as
// cancelling a statement may end the connection, the whole batch's. A claim
// that waited longer fails with an error matching ErrClaimInProgress. ctx
// is not cancelled by the inbox while the claim runs.
type SavepointClaimer interface {
	Savepointer
	ClaimAfter(ctx context.Context, release, savepoint, consumer, key string, wait time.Duration) (bool, error)
}

// batchClaimWait is how long a batched claim waits for another
// transaction's claim of the same key before its delivery leaves the batch.
const batchClaimWait = time.Millisecond

// errNoSavepoints marks a store whose units of work cannot batch.
var errNoSavepoints = errors.New("deduplication: the store's units of work are no Savepointers")

// batcher gathers one stage's deliveries into batches.
type batcher struct {
	d           *deduplicator
	cfg         BatchConfig
	timer       func(time.Duration) *time.Timer // time.NewTimer but in a test
	unsupported atomic.Bool

	mu   sync.Mutex
	open *batch // taking in deliveries, or nil
	// suspects are keys whose batch failed to commit: their next delivery
	// runs alone, so a delivery that makes every commit fail (a deferred
	// constraint) fails alone, and the copies of its neighbours, retried in
	// lockstep with it, do not fail with it again and again. Bounded.
	suspects map[string]struct{}
	order    []string
}

// suspectsMax bounds the keys a batcher remembers as suspects.
const suspectsMax = 4096

// suspect remembers keys whose batch failed to commit.
func (bt *batcher) suspect(keys []string) {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if bt.suspects == nil {
		bt.suspects = map[string]struct{}{}
	}
	for _, k := range keys {
		if _, ok := bt.suspects[k]; ok {
			continue
		}
		if len(bt.order) >= suspectsMax {
			delete(bt.suspects, bt.order[0])
			bt.order = bt.order[1:]
		}
		bt.suspects[k] = struct{}{}
		bt.order = append(bt.order, k)
	}
}

// cleared reports whether key may join a batch, and forgets it as a
// suspect: it runs alone once.
func (bt *batcher) cleared(key string) bool {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if _, ok := bt.suspects[key]; !ok {
		return true
	}
	delete(bt.suspects, key)
	if i := slices.Index(bt.order, key); i >= 0 {
		bt.order = slices.Delete(bt.order, i, i+1)
	}
	return false
}

// batch is one shared unit of work.
type batch struct {
	bt    *batcher
	ready chan struct{} // closed once the unit of work began (or failed to)
	tx    Tx
	sp    Savepointer
	err   error // Begin's

	claimer SavepointClaimer // sp, when it is one

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
		sp, ok := tx.(Savepointer)
		if !ok {
			b.bt.unsupported.Store(true)
			_ = d.rollback(context.Background(), tx)
			err = errNoSavepoints
		}
		b.tx, b.sp = tx, sp
		b.claimer, _ = tx.(SavepointClaimer)
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

// exec runs one statement of the shared unit of work within StoreTimeout; a
// statement given up, or one that failed where nothing else can go on (a
// failed rollback to a savepoint), breaks the batch.
func (b *batch) exec(ctx context.Context, f func(context.Context) error) error {
	d := b.bt.d
	if d.storeBound <= 0 {
		return f(ctx)
	}
	_, gaveUp, err := bounded.Run(d.calls, endContext(ctx), d.storeBound, false, func(ctx context.Context) (struct{}, error) {
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
// SavepointClaimer, in one round trip that also releases the savepoint of
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
		case err == nil, errors.Is(err, ErrClaimInProgress), errors.Is(err, ErrAborted):
			return claimed, false, err
		case gaveUp:
			return false, true, &sluice.DependencyError{Op: fmt.Sprintf("deduplication: claim %q", diag.Bound(key, 128)), Err: err}
		}
		return false, false, dependency(ctx, fmt.Sprintf("claim %q", diag.Bound(key, 128)), err)
	}
	claimed, gaveUp, err = claim(release)
	if err != nil && !gaveUp && prev != nil && errors.Is(err, ErrAborted) {
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

// handle runs msg's claim and handler in a batch. handled false: msg left
// the batch before its claim (its turn did not come within QueueTimeout,
// its key is claimed in the batch, or the store cannot batch) and must run
// in a unit of work of its own.
func (bt *batcher) handle(msg *message.Message, key string, h message.HandlerFunc) (produced []*message.Message, err error, handled bool) {
	d := bt.d
	if !bt.cleared(key) {
		return nil, nil, false
	}
	b := bt.join()
	inBatch := true
	leave := func() {
		if inBatch {
			inBatch = false
			b.mu.Lock()
			b.active--
			if b.active == 0 {
				select {
				case b.idle <- struct{}{}:
				default: // already signalled
				}
			}
			b.mu.Unlock()
		}
	}
	defer leave()
	<-b.ready // Begin is bounded by StoreTimeout
	if b.err != nil {
		if errors.Is(b.err, errNoSavepoints) {
			return nil, nil, false
		}
		return nil, sluice.Transient(b.err), true
	}

	t := time.NewTimer(bt.cfg.QueueTimeout)
	select {
	case <-b.turn:
		t.Stop()
	case <-t.C:
		return nil, nil, false
	}
	holding := true
	release := func() {
		if holding {
			holding = false
			b.turn <- struct{}{}
		}
	}
	defer release()

	ctx := msg.Context()
	b.mu.Lock()
	broken := b.broken
	_, again := b.keys[key]
	b.mu.Unlock()
	if broken != nil {
		return nil, sluice.Transient(broken), true
	}
	if again { // the same key claimed earlier in this batch: decided by its commit
		release()
		leave()
		<-b.done
		return nil, nil, false
	}
	sp := "sluice_" + strconv.Itoa(b.next)
	b.next++
	claimed, gaveUp, err := b.savepointAndClaim(ctx, sp, key)
	switch {
	case gaveUp:
		b.breakWith(err)
		return nil, sluice.Transient(err), true
	case b.claimer != nil && errors.Is(err, ErrClaimInProgress):
		return nil, nil, false // held elsewhere: wait for it alone (ClaimTimeout)
	case err != nil:
		return nil, sluice.Transient(err), true
	case !claimed:
		b.undo(ctx, sp)
		d.duplicate(msg, key)
		return nil, nil, true
	}
	b.mu.Lock()
	b.keys[key] = struct{}{}
	b.mu.Unlock()
	forget := func() {
		b.mu.Lock()
		delete(b.keys, key)
		b.mu.Unlock()
	}

	u := &unit{Context: ctx, tx: b.tx, eventID: msg.Metadata.Get(sluice.EventIDKey)}
	msg.SetContext(u)
	panicked := true
	defer func() {
		if panicked { // roll back to the savepoint, then let it unwind
			msg.SetContext(ctx)
			b.undo(ctx, sp)
			forget()
		}
	}()
	produced, err = h(msg)
	panicked = false
	msg.SetContext(ctx)
	rejected := err != nil
	if rejected && d.cfg.Classifier.Classify(err) != sluice.ClassRejected {
		b.undo(ctx, sp)
		forget()
		if lockConflict(err) { // the batch's locks' doing: not the delivery's attempt
			return nil, nil, false
		}
		return produced, err, true
	}
	m := &member{sp: sp, key: key}
	// Kept: wait for the batch's commit, and return what it decided.
	kept := func() ([]*message.Message, error, bool) {
		b.mu.Lock()
		b.kept++
		if b.attrs == nil {
			b.attrs = telemetry.DeliveryAttr(msg)
		}
		b.mu.Unlock()
		release()
		leave()
		<-b.done
		switch {
		case m.err != nil:
			return nil, m.err, true
		case b.commitErr != nil && commitOfTheBatch(b.commitErr):
			return nil, nil, false // rolled back: run again alone, at once
		case b.commitErr != nil:
			return nil, sluice.Transient(errors.Join(err, fmt.Errorf("deduplication: commit: %w", b.commitErr))), true
		}
		u.committed()
		return produced, err, true
	}
	if !rejected && b.claimer != nil {
		b.pending = m // released with the next delivery's claim, or by the commit
		return kept()
	}
	if rerr := b.exec(ctx, func(ctx context.Context) error { return b.sp.Release(ctx, sp) }); rerr != nil {
		b.undo(ctx, sp)
		if !rejected || !errors.Is(rerr, ErrAborted) {
			forget()
			return nil, sluice.Transient(errors.Join(err, fmt.Errorf("deduplication: commit: %w", rerr))), true
		}
		// A rejection after a statement that aborted the transaction: its
		// claim alone, with what it produced (OnRecordAlone), as without
		// batching.
		if aerr := b.recordAlone(ctx, sp, key, u); aerr != nil {
			forget()
			if errors.Is(aerr, errProcessedMeanwhile) {
				d.duplicate(msg, key)
				return nil, nil, true
			}
			return nil, sluice.Transient(errors.Join(err, aerr)), true
		}
	}
	return kept()
}

// recordAlone claims key again after the unit of work was rolled back to
// sp, with the writes registered by OnRecordAlone.
func (b *batch) recordAlone(ctx context.Context, sp, key string, u *unit) error {
	d := b.bt.d
	claimed, gaveUp, err := d.claim(ctx, b.tx, key)
	if err != nil {
		if gaveUp {
			b.breakWith(err)
		} else {
			b.undo(ctx, sp)
		}
		return fmt.Errorf("deduplication: recording the rejection: %w", err)
	}
	if !claimed { // a redelivery processed the key meanwhile (see claimAlone)
		b.undo(ctx, sp)
		return errProcessedMeanwhile
	}
	for _, write := range u.rewrites() {
		if err := write(endContext(ctx), b.tx); err != nil {
			b.undo(ctx, sp)
			return fmt.Errorf("deduplication: writing again what the rejected handler wrote for its commit: %w", err)
		}
	}
	if err := b.exec(ctx, func(ctx context.Context) error { return b.sp.Release(ctx, sp) }); err != nil {
		b.undo(ctx, sp)
		return fmt.Errorf("deduplication: recording the rejection: %w", err)
	}
	return nil
}

// duplicate counts, logs and reports a delivery whose key was processed
// before.
func (d *deduplicator) duplicate(msg *message.Message, key string) {
	ctx := msg.Context()
	d.duplicates.Add(ctx, 1, telemetry.DeliveryAttr(msg))
	d.cfg.Logger.Debug("Duplicate delivery skipped: the key was processed before", telemetry.LogFields(msg, watermill.LogFields{"key": diag.Bound(key, 128)}))
	sluice.Record(ctx, func(r *sluice.Report) { r.Outcome = sluice.OutcomeDuplicate })
}
