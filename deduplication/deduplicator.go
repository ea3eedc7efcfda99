package deduplication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/keysource"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/internal/unitctx"
	"github.com/sluicemq/sluice/unitofwork"
)

// keyMaxLengthDefault is Config.KeyMaxLength's default.
const keyMaxLengthDefault = 512

// claimTimeoutDefault is Config.ClaimTimeout's default.
const claimTimeoutDefault = 5 * time.Second

// storeTimeoutDefault is Config.StoreTimeout's default.
const storeTimeoutDefault = 10 * time.Second

// Config configures the inbox stage (New).
type Config struct {
	// Store records processed keys. Required.
	Store Store
	// Consumer names the consumer whose effects are deduplicated; the same
	// key is processed once per consumer. Keep it stable: renaming it makes
	// every retained key new again. Required.
	Consumer string
	// Key takes the key from a message. Default
	// sluice.KeyFromMetadata(sluice.EventIDKey).
	Key sluice.KeyFunc
	// Env is the shared environment (router.Stages and service give theirs;
	// the fields set here win). The inbox reads Classifier, which decides
	// whether a handler error is a rejection, whose writes are committed —
	// give the Classify stage the same value (default
	// sluice.DefaultClassifier()); MeterProvider, which receives the
	// duplicates counter and, with Batch, the batch sizes (default the global
	// OpenTelemetry provider); TracerProvider, which receives a batch
	// handler's spans (NewBatchHandler; default the global provider);
	// Logger, one debug line per duplicate (default
	// watermill.NopLogger; router.Add gives the router's); StoreTimeout,
	// which bounds every call of the stage to its store: Begin, the Commit
	// and the Rollback that end the unit of work, and the Claim (for
	// ClaimTimeout plus StoreTimeout). A call that outlives it is given up —
	// it goes on in the background and its unit of work is rolled back when
	// it returns — and the delivery fails at once as Transient with
	// ErrStoreTimeout in a *sluice.DependencyError, which
	// brake.MatchUnreachable counts: a black-holed database, whose driver
	// honours no context (lib/pq while it connects without connect_timeout,
	// or while its cancel request cannot get through), no longer freezes
	// every handler. The unit of work is begun on a context detached from
	// the message's once Begin returned (database/sql rolls a transaction
	// back when the context it was begun on ends), and the commit and the
	// rollback run on one detached too: a handler that succeeded as its
	// deadline ended (Watermill's Timeout, the shutdown grace running out)
	// is committed, not failed after its effects — on a store whose handler
	// effects live outside the unit of work (Redis) a failed commit would
	// run them again. Default 10 s; negative: no bound but the message
	// context's (and commits and rollbacks unbounded).
	sluice.Env
	// KeyMaxLength is the longest key accepted, in bytes: longer keys are
	// poison (an id that long is a bug, and B-tree indexes limit entry
	// size; a store sizes its key column by it). Default 512.
	KeyMaxLength int
	// ClaimTimeout bounds the claim: how long a delivery waits for a
	// concurrent delivery of the same key that holds it (a slow handler).
	// A claim that waits longer gives its consumer back with a Transient
	// failure matching ErrClaimInProgress (the duplicate goes to a retry
	// tier), so duplicates of one slow event cannot stall every consumer.
	// It is a deadline on the claim's context: it costs nothing while
	// there is no contention (no statement, no round trip), applies to
	// every store, and leaves the handler's own statements unbounded by it.
	// On PostgreSQL with lib/pq the timed-out statement is cancelled and its
	// connection closed (the pool opens another). Default
	// 5 s; negative: no bound but the message context's.
	ClaimTimeout time.Duration
	// Batch, when set, turns on group commit: the deliveries in flight on
	// the handler share one transaction, each in a savepoint of its own,
	// committed once (BatchConfig). Default nil: one transaction per
	// delivery.
	Batch *BatchConfig
}

// withDefaults returns a copy of c with its defaults filled. A negative
// ClaimTimeout or StoreTimeout (no bound) is kept.
func (c Config) withDefaults() Config {
	if c.Key == nil { // a func, not comparable: no cmp.Or
		c.Key = sluice.KeyFromMetadata(sluice.EventIDKey)
	}
	c.Classifier = cmp.Or(c.Classifier, sluice.DefaultClassifier())
	c.KeyMaxLength = cmp.Or(c.KeyMaxLength, keyMaxLengthDefault)
	c.ClaimTimeout = cmp.Or(c.ClaimTimeout, claimTimeoutDefault)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, storeTimeoutDefault)
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	return c
}

func (c Config) validate() error {
	switch {
	case c.Store == nil:
		return errors.New("deduplication: Config.Store is required")
	case strings.TrimSpace(c.Consumer) == "":
		return errors.New("deduplication: Config.Consumer is required")
	case c.KeyMaxLength < 0:
		return fmt.Errorf("deduplication: Config.KeyMaxLength must be positive, got %d", c.KeyMaxLength)
	case c.Batch != nil:
		return c.Batch.withDefaults().validate()
	}
	return nil
}

// deduplicator is the inbox stage.
type deduplicator struct {
	cfg        Config
	duplicates metric.Int64Counter
	batchSize  metric.Int64Histogram
	batches    *batcher       // with Config.Batch
	calls      *bounded.Calls // the store calls' bounds; given-up calls outstanding
	// storeBound is StoreTimeout, or -1 for the MemoryStore, bounded by
	// its contexts, whose calls run directly.
	storeBound time.Duration
	// memory: the store is the MemoryStore, whose unit of work outlives
	// any context (a StoreTimeout negative is not that).
	memory bool
}

// New validates cfg and returns the inbox stage: it runs a handler at most
// once per (Consumer, key), with the inbox record and the handler's writes
// in one unit of work. It is safe for concurrent use.
//
// For each message it takes the key (none: a Poison failure, the handler not
// run), opens a unit of work, claims (Consumer, key) and:
//   - key already processed: rolls back, skips the handler, returns nil (ack);
//   - claimed: runs the handler with the unit of work in the message context
//     (unitofwork.FromContext, and a store's own accessor such as
//     sluicesql.TxFromContext); commits when it succeeds or returns a
//     rejection, rolls back otherwise and returns its error. A failed commit
//     is a Transient failure, so the message is not acked before its commit.
//
// It sets sluice.EventIDKey in the metadata to the key when it is missing,
// so copies published by outer stages carry it.
func New(cfg Config) (message.HandlerMiddleware, error) {
	return newStage(cfg, time.NewTimer)
}

// newStage is New with the timer that closes a batch after MaxWait.
func newStage(cfg Config, batchTimer func(time.Duration) *time.Timer) (message.HandlerMiddleware, error) {
	d, err := newDeduplicator(cfg, batchTimer)
	if err != nil {
		return nil, err
	}
	return d.middleware, nil
}

// newDeduplicator validates cfg and builds the stage.
func newDeduplicator(cfg Config, batchTimer func(time.Duration) *time.Timer) (*deduplicator, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dup, err := telemetry.DuplicatesCounter(cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	d := &deduplicator{cfg: cfg, duplicates: dup, storeBound: cfg.StoreTimeout, calls: newCalls()}
	if cfg.Batch != nil {
		d.batches = &batcher{d: d, cfg: cfg.Batch.withDefaults(), timer: batchTimer}
		if d.batchSize, err = batchSizeHistogram(cfg); err != nil {
			return nil, err
		}
	}
	// The memory store waits on nothing but a concurrent claim, and that only
	// until its context ends: its calls run directly. Any other store's run
	// on a goroutine of their own, to give up on one that outlives
	// StoreTimeout: database drivers do not all honour their contexts
	// (lib/pq while it connects without connect_timeout, or while its
	// cancel request cannot reach a black-holed server).
	if _, ok := cfg.Store.(*MemoryStore); ok {
		d.storeBound, d.memory = -1, true
	}
	return d, nil
}

func (d *deduplicator) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (_ []*message.Message, err error) {
		key, err := d.key(msg)
		if err != nil {
			return nil, sluice.Poison(err)
		}
		if msg.Metadata.Get(sluice.EventIDKey) == "" {
			msg.Metadata.Set(sluice.EventIDKey, key)
		}

		if d.batches != nil && !d.batches.unsupported.Load() {
			if produced, err, handled := d.batches.handle(msg, key, h); handled {
				return produced, err
			}
		}
		for run := 1; ; run++ {
			produced, err := d.alone(msg, key, h)
			if d.batches == nil || run == aloneRunsMax || !lockConflict(err) {
				return produced, err
			}
			// Its row lock queued behind batches that hold theirs until
			// their commits: the batches' doing, not the delivery's.
		}
	}
}

// aloneRunsMax bounds the runs of a delivery in a unit of work of its own
// that a deadlock, a serialization failure or a lock timeout ends, with
// group commit on (see lockConflict): a lone update can still be the victim
// of a deadlock among batches, as the first in the queue of a row's lock —
// and again: at 3 runs, 2 of 400 deliveries on 4 hot rows lost all three
// (TestGroupCommitDeadlocksOnHotRowsSpendNoAttempt, 133 deadlocks, in a
// fresh-clone make test) and spent an attempt on the batches' doing. Each
// run ends within the database's deadlock_timeout (1 s by default) or the
// lock timeout.
const aloneRunsMax = 10

// alone runs msg's claim and handler in a unit of work of its own.
func (d *deduplicator) alone(msg *message.Message, key string, h message.HandlerFunc) (_ []*message.Message, err error) {
	ctx := msg.Context()
	tx, err := d.begin(ctx)
	if err != nil {
		return nil, sluice.Transient(err)
	}
	ended := false // committed, rolled back, or handed to a call given up that ends it
	defer func() {
		if ended {
			return
		}
		// Also on a panic in h: release the claim, then let it unwind.
		endCtx := endContext(ctx)
		if rbErr := d.rollback(endCtx, tx); rbErr != nil && err != nil {
			err = errors.Join(err, fmt.Errorf("deduplication: rollback: %w", rbErr))
		}
	}()

	claimed, gaveUp, err := d.claim(ctx, tx, key)
	if err != nil {
		ended = gaveUp // the claim still holds tx: its late return rolls it back
		return nil, sluice.Transient(err)
	}
	if !claimed {
		d.duplicate(msg, key)
		return nil, nil
	}

	u := unitctx.New[unitofwork.Tx](ctx, tx, msg.Metadata.Get(sluice.EventIDKey))
	msg.SetContext(u)
	produced, err := h(msg)
	msg.SetContext(ctx)
	rejected := err != nil
	if rejected && d.cfg.Classifier.Classify(err) != sluice.ClassRejected {
		return produced, err
	}
	endCtx := endContext(ctx)
	gaveUp, cErr := d.commit(endCtx, tx)
	if gaveUp {
		ended = true // the commit's outcome is unknown: a redelivery finds it or not
		return nil, sluice.Transient(errors.Join(err, cErr))
	}
	if cErr != nil { // the deferred rollback releases what is left
		if rejected && errors.Is(cErr, unitofwork.ErrAborted) {
			// A rejection often follows a statement that aborted the
			// transaction (a unique violation on PostgreSQL), whose
			// commit then fails. The rejection is still final: record
			// the claim alone in a unit of work of its own, so the
			// message is acked and a redelivery is a duplicate. The
			// handler's writes are rolled back with the aborted one.
			// Any other failed commit (a lost connection, 40001) may
			// succeed next time: the delivery is retried, so the
			// rejection's writes commit with its claim or not at all.
			rErr := d.claimAlone(endCtx, tx, key, u.Rewrites())
			if rErr == nil {
				ended = true
				u.Committed()
				return produced, err
			}
			if errors.Is(rErr, errProcessedMeanwhile) {
				ended = true
				d.duplicate(msg, key)
				return nil, nil
			}
			cErr = errors.Join(cErr, rErr)
		}
		return nil, sluice.Transient(errors.Join(err, fmt.Errorf("deduplication: commit: %w", cErr)))
	}
	ended = true
	u.Committed()
	return produced, err
}

// duplicate counts, logs and reports a delivery whose key was processed
// before.
func (d *deduplicator) duplicate(msg *message.Message, key string) {
	ctx := msg.Context()
	d.duplicates.Add(ctx, 1, telemetry.DeliveryAttr(msg))
	d.cfg.Logger.Debug("Duplicate delivery skipped: the key was processed before", telemetry.LogFields(msg, watermill.LogFields{"key": diag.Bound(key, 128)}))
	sluice.Record(ctx, func(r *sluice.Report) { r.Outcome = sluice.OutcomeDuplicate })
}

// endContext is the context that ends a unit of work: ctx's values, not its
// deadline or cancellation (StoreTimeout bounds each call on it).
func endContext(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// begin opens a unit of work within StoreTimeout. On an ended ctx it asks
// the store nothing, bounded or not: the delivery fails with ctx's cause,
// not as a store that did not answer.
func (d *deduplicator) begin(ctx context.Context) (unitofwork.Tx, error) {
	if d.storeBound <= 0 {
		if ctx.Err() != nil { // as bounded.Run does for the bounded calls
			return nil, dependency(ctx, "begin", context.Cause(ctx))
		}
		tx, err := d.open(ctx)
		if err != nil {
			return nil, dependency(ctx, "begin", err)
		}
		return tx, nil
	}
	open := func(context.Context) (unitofwork.Tx, error) { return d.open(ctx) }
	tx, gaveUp, err := bounded.Run(d.calls, ctx, d.storeBound, true, open, func(tx unitofwork.Tx, err error) {
		if err == nil { // opened after all, for nobody
			d.lateRollback(ctx, tx)
		}
	})
	if err != nil && !gaveUp {
		return nil, dependency(ctx, "begin", err)
	}
	if gaveUp {
		return nil, &sluice.DependencyError{Op: "deduplication: begin", Err: err}
	}
	return tx, nil
}

// open calls the store's Begin on a context that ends with ctx only until
// Begin returns: the unit of work it opens is bound to that context
// (database/sql rolls a transaction back when the context given to BeginTx
// ends), and must outlive the message's — a handler that succeeds as its
// deadline passes (Watermill's Timeout) is committed, on the end context.
// The handler and the claim still see ctx itself. begin waits for it at
// most StoreTimeout; one that returns after ctx ended opens nothing: its
// unit of work is rolled back. One that returns after begin gave up is
// rolled back by begin, its connection kept for the next delivery.
func (d *deduplicator) open(ctx context.Context) (unitofwork.Tx, error) {
	if d.memory { // its unit of work outlives any context
		return d.cfg.Store.Begin(ctx)
	}
	uctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	tx, err := d.cfg.Store.Begin(uctx)
	if !stop() { // ctx ended while Begin ran: uctx ended with it
		if err == nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			err = context.Cause(uctx)
		}
		return nil, err
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	return tx, nil
}

// lateRollback rolls back tx, which a call given up returned or held.
func (d *deduplicator) lateRollback(ctx context.Context, tx unitofwork.Tx) {
	// Already in the background (bounded.Run's late), counted among the
	// calls outstanding while it runs: not bounded again, which past
	// abandonedMax would refuse the rollback and leave tx open.
	_ = tx.Rollback(endContext(ctx))
}

// rollback rolls back tx within StoreTimeout (ctx is the end context).
func (d *deduplicator) rollback(ctx context.Context, tx unitofwork.Tx) error {
	if d.storeBound <= 0 {
		return tx.Rollback(ctx)
	}
	_, _, err := bounded.Run(d.calls, ctx, d.storeBound, false, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, tx.Rollback(ctx)
	}, func(_ struct{}, err error) {
		if err != nil { // refused past abandonedMax, not run: now, in the background
			d.lateRollback(ctx, tx)
		}
	})
	return err
}

// commit commits tx within StoreTimeout (ctx is the end context); gaveUp
// reports a commit given up, whose outcome is unknown.
func (d *deduplicator) commit(ctx context.Context, tx unitofwork.Tx) (gaveUp bool, err error) {
	if d.storeBound <= 0 {
		return false, tx.Commit(ctx)
	}
	_, gaveUp, err = bounded.Run(d.calls, ctx, d.storeBound, false, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, tx.Commit(ctx)
	}, func(_ struct{}, err error) {
		if err != nil {
			_ = tx.Rollback(ctx) // ctx is detached already; after a failed commit (a no-op after Commit)
		}
	})
	if gaveUp {
		return true, &sluice.DependencyError{Op: "deduplication: commit", Err: err}
	}
	return false, err
}

// claim claims key within ClaimTimeout, and gives the store StoreTimeout
// more to answer; gaveUp reports a claim given up, which still holds tx
// (its late return rolls tx back).
func (d *deduplicator) claim(ctx context.Context, tx unitofwork.Tx, key string) (claimed, gaveUp bool, err error) {
	if ib, ok := tx.(IdleBounder); ok {
		if dl, ok := ctx.Deadline(); ok {
			// The unit of work idles at most while the handler runs, up
			// to its deadline, then its commit within StoreTimeout.
			idle := max(time.Until(dl), 0) + max(d.cfg.StoreTimeout, 0) + idleGrace
			return d.claimWith(ctx, tx, key, func(ctx context.Context) (bool, error) { return ib.ClaimIdle(ctx, d.cfg.Consumer, key, idle) })
		}
	}
	return d.claimWith(ctx, tx, key, func(ctx context.Context) (bool, error) { return tx.Claim(ctx, d.cfg.Consumer, key) })
}

// claimBound is the bound of a claim's store call (bounded.Run):
// ClaimTimeout plus StoreTimeout; with a negative ClaimTimeout the
// delivery's context alone, given up Grace after it ends — a driver that
// does not honour it (lib/pq toward a black-holed server) holds the call
// past it; none with a negative StoreTimeout.
func (d *deduplicator) claimBound() time.Duration {
	if d.cfg.ClaimTimeout < 0 {
		return d.within(untilEnded)
	}
	return d.within(d.cfg.ClaimTimeout)
}

// within is the bound of a store call that waits up to wait: StoreTimeout
// more; none (-1) with a negative StoreTimeout.
func (d *deduplicator) within(wait time.Duration) time.Duration {
	if d.storeBound <= 0 {
		return -1
	}
	return d.storeBound + wait
}

// untilEnded is a bound that its context's end comes before.
const untilEnded = 100 * 365 * 24 * time.Hour

// idleGrace is added to a unit of work's idle bound (IdleBounder): the
// handler's return, the stages after it, the commit's start.
const idleGrace = time.Second

// claimWith is claim with the store call f (which claims key in tx).
func (d *deduplicator) claimWith(ctx context.Context, tx unitofwork.Tx, key string, f func(context.Context) (bool, error)) (claimed, gaveUp bool, err error) {
	claimCtx := ctx
	var deadline *claimContext
	if d.cfg.ClaimTimeout > 0 {
		deadline = newClaimContext(ctx, d.cfg.ClaimTimeout)
		defer deadline.release()
		claimCtx = deadline
	}
	bound := d.claimBound()
	if bound <= 0 {
		claimed, err = f(claimCtx)
	} else {
		claimed, gaveUp, err = bounded.Run(d.calls, claimCtx, bound, false, f, func(bool, error) { d.lateRollback(ctx, tx) })
	}
	switch {
	case err == nil:
		return claimed, false, nil
	case gaveUp: // the store's failure, unless the delivery's context ended first
		return false, true, dependency(ctx, fmt.Sprintf("claim %q", diag.Bound(key, 128)), err)
	case deadline != nil && deadline.Err() != nil && ctx.Err() == nil:
		return false, false, fmt.Errorf("%w: claim %q waited longer than the claim timeout (%s): %w", ErrClaimInProgress, key, d.cfg.ClaimTimeout, err)
	case errors.Is(err, ErrClaimInProgress):
		// A store that does not wait (Redis) answered: another unit of
		// work holds the key — an answer, not the store's failure, so not
		// a DependencyError the brake would count.
		return false, false, fmt.Errorf("deduplication: claim %q: %w", diag.Bound(key, 128), err)
	}
	return false, false, dependency(ctx, fmt.Sprintf("claim %q", diag.Bound(key, 128)), err)
}

// dependency wraps a failure of the store's own call op: a
// *sluice.DependencyError (the brake's MatchUnreachable counts it), unless
// the message context ended first — the handler's deadline or a shutdown is
// not the store's failure.
func dependency(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("deduplication: %s: %w", op, err)
	}
	return &sluice.DependencyError{Op: "deduplication: " + op, Err: err}
}

// errProcessedMeanwhile is claimAlone's error when another delivery of the
// key committed between the aborted unit of work's rollback and the new
// claim: the rejection is then a duplicate, and writes nothing.
var errProcessedMeanwhile = errors.New("deduplication: the key was processed meanwhile")

// claimAlone rolls back the aborted unit of work and claims key in a new one,
// with the writes registered by unitofwork.OnRecordAlone, on ctx, the detached context
// that ends the delivery's unit of work. The aborted unit of work committed
// nothing, so a claim reporting false means a redelivery of the key,
// waiting on it, claimed and committed it meanwhile: errProcessedMeanwhile,
// nothing written.
func (d *deduplicator) claimAlone(ctx context.Context, aborted unitofwork.Tx, key string, rewrites []func(context.Context, unitofwork.Tx) error) error {
	if err := aborted.Rollback(ctx); err != nil {
		return fmt.Errorf("deduplication: rolling back the aborted unit of work: %w", err)
	}
	tx, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("deduplication: begin, to record the rejection: %w", err)
	}
	claimed, gaveUp, err := d.claim(ctx, tx, key)
	if err != nil {
		if gaveUp {
			return fmt.Errorf("deduplication: recording the rejection: %w", err)
		}
		return errors.Join(fmt.Errorf("deduplication: recording the rejection: %w", err), d.rollback(ctx, tx))
	}
	if !claimed { // a redelivery processed the key while the aborted unit of work held none
		return errors.Join(errProcessedMeanwhile, d.rollback(ctx, tx))
	}
	for _, write := range rewrites {
		if err := write(ctx, tx); err != nil {
			return errors.Join(fmt.Errorf("deduplication: writing again what the rejected handler wrote for its commit: %w", err), d.rollback(ctx, tx))
		}
	}
	if gaveUp, err := d.commit(ctx, tx); err != nil {
		if gaveUp {
			return fmt.Errorf("deduplication: commit, to record the rejection: %w", err)
		}
		return errors.Join(fmt.Errorf("deduplication: commit, to record the rejection: %w", err), d.rollback(ctx, tx))
	}
	return nil
}

func (d *deduplicator) key(msg *message.Message) (string, error) {
	key, err := d.cfg.Key(msg)
	if err != nil {
		return "", err
	}
	var reason string
	switch {
	case key == "":
		reason = "empty"
	case len(key) > d.cfg.KeyMaxLength:
		reason = fmt.Sprintf("%d bytes long, more than %d", len(key), d.cfg.KeyMaxLength)
	case strings.IndexByte(key, 0) >= 0:
		reason = "contains a NUL byte"
	case !utf8.ValidString(key):
		reason = "not valid UTF-8"
	default:
		return key, nil
	}
	return "", &sluice.KeyError{Source: d.keySource(msg), Reason: reason}
}

// keySource names where the key function took msg's key from, as the
// root's key functions describe themselves (`JSON field "eventId"`),
// or "key function" for others. It runs the key function again, on the
// error path only.
func (d *deduplicator) keySource(msg *message.Message) string {
	orig := msg.Context()
	ctx, src := keysource.Collect(orig)
	msg.SetContext(ctx)
	_, _ = d.cfg.Key(msg)
	msg.SetContext(orig)
	if len(*src) == 0 {
		return "key function"
	}
	return strings.Join(*src, " + ")
}
