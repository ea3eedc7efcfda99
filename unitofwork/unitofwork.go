// Package unitofwork is the inbox's unit of work, which the stages and the
// stores share: the inbox stage (package deduplication) opens one per
// delivery from its Store, claims the delivery's key in it and runs the
// handler with it in the message context; what the handler and the other
// stages write through it commits with the claim or not at all.
//
// A handler reaches it with FromContext, or with its store's own accessor of
// the concrete unit of work (sluicesql.TxFromContext: the *sqlx.Tx); OnCommit
// runs a hook after its commit (the outbox wakes its relay), OnRecordAlone
// writes again what must commit with a rejection's claim (the outbox's
// rejection event); Reentry keeps a handler from running twice in one. A
// store whose units of work are Savepointers can commit many deliveries in
// one (group commit, deduplication.BatchConfig). Importing it links no
// stage and no store.
package unitofwork

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/internal/unitctx"
)

// Tx is the unit of work of one delivery, as a store's Begin opens it
// (deduplication.Store): at most one Claim, then Commit or Rollback. It is
// used by one goroutine at a time.
type Tx interface {
	// Claim records (consumer, key) and reports true, or reports false when a
	// committed unit of work recorded it before. While another open unit of
	// work holds the same pair, Claim either waits until that one ends (and
	// then reports false after its Commit, true after its Rollback) or
	// returns an error wrapping deduplication.ErrClaimInProgress; it never
	// reports true while the other holds the pair.
	Claim(ctx context.Context, consumer, key string) (bool, error)
	// Commit makes the claim permanent, together with whatever else the
	// unit of work wrote. When it fails because a statement before it
	// aborted the unit of work (nothing is committed, and no retry of the
	// commit can change that: a PostgreSQL transaction in the failed state,
	// a deferred constraint violated), the error matches ErrAborted; any
	// other failure (a lost connection, a serialization failure) must not.
	Commit(ctx context.Context) error
	// Rollback releases the claim. After Commit it does nothing and returns
	// nil, so it can be deferred.
	Rollback(ctx context.Context) error
}

// ErrAborted is matched by a Tx's Commit error when an earlier statement
// aborted the unit of work: nothing was committed, and committing again
// cannot help. After a rejection the inbox then records the claim alone; any
// other commit failure retries the delivery.
var ErrAborted = errors.New("unitofwork: the unit of work was aborted by an earlier statement")

// ErrMissing is matched by the error of a write into the unit of work ctx
// carries — outbox.Writer.Publish, replay.UnitOfWorkRecorder's
// RecordInUnitOfWork — when ctx carries none the store can write in: no
// inbox stage, or an inbox on another store or database. Nothing was
// written.
var ErrMissing = errors.New("unitofwork: no unit of work to write in")

// Savepointer is implemented by a Tx that can mark a point in itself and
// undo what followed it: the SQL store's, which group commit needs. name is
// an SQL identifier the inbox generates. Release fails with an error
// matching ErrAborted when an earlier statement aborted the transaction.
type Savepointer interface {
	Savepoint(ctx context.Context, name string) error
	RollbackTo(ctx context.Context, name string) error
	Release(ctx context.Context, name string) error
}

// unitOf returns the delivery's unit of work that ctx carries.
func unitOf(ctx context.Context) (*unitctx.Unit[Tx], bool) { return unitctx.Of[Tx](ctx) }

// FromContext returns the unit of work of the delivery being handled — the
// Tx its Store's Begin returned, in which the key was claimed — or nil
// outside the inbox stage. It is the store-agnostic accessor: a store gives
// its handlers the concrete unit of work (an SQL transaction, ...) with an
// accessor of its own that type-asserts this one's result to its Tx type,
// as sluicesql.TxFromContext does. A third-party store does the same (see
// examples/mariadbstore).
func FromContext(ctx context.Context) Tx {
	if u, ok := unitOf(ctx); ok {
		return u.Tx
	}
	return nil
}

// EventID returns the event id (sluice.EventIDKey) of the delivery being
// handled, as the inbox read it or set it from its key, or "" outside the
// inbox stage. The outbox compares each produced message's with it: a
// message that copied the delivery's metadata gets an event id of its own,
// so the receiving inbox does not take it for a duplicate.
func EventID(ctx context.Context) string {
	if u, ok := unitOf(ctx); ok {
		return u.EventID
	}
	return ""
}

// OnCommit registers f to run after the unit of work that ctx carries has
// committed — never after a rollback — and reports false, registering
// nothing, outside the inbox stage. f runs on the delivery's goroutine
// before the stage returns: keep it short (the outbox wakes its relay with
// it).
func OnCommit(ctx context.Context, f func()) bool {
	u, ok := unitOf(ctx)
	if ok {
		u.OnCommit(f)
	}
	return ok
}

// OnRecordAlone registers write for the one case where the unit of work
// that ctx carries is replaced: the handler rejected the message
// (sluice.Reject) after a statement that aborted the transaction, and the
// inbox records the claim alone in a new unit of work (see
// deduplication.New). write then runs in that new unit of work, before its
// commit, so what the rejected handler wrote through it — the outbox's
// rejection event — commits with the claim. It reports false, registering
// nothing, outside the inbox stage. A write that fails there fails the
// delivery as Transient: it is retried, nothing is committed.
func OnRecordAlone(ctx context.Context, write func(ctx context.Context, tx Tx) error) bool {
	u, ok := unitOf(ctx)
	if ok {
		u.OnRecordAlone(write)
	}
	return ok
}

// errHandlerReentered is the error Reentry returns when the handler is run
// a second time inside one inbox unit of work: a composition bug its text
// names, not a condition a program branches on.
var errHandlerReentered = errors.New("unitofwork: the handler ran again inside one inbox unit of work " +
	"(an in-process retry, such as Watermill's middleware.Retry, sits inside the inbox: add it before Sluice's stages, or leave it out)")

// Reentry guards h against running twice in one inbox unit of work. An
// in-process retry middleware placed inside the inbox (Watermill's Retry
// added to the router after Sluice's stages) would run the handler again in
// the same transaction, on top of the failed run's writes: a handler that
// wrote its row and failed once would commit two rows for one event.
// Reentry runs h once per unit of work; a second run returns, without
// running h, an error that says so ("the handler ran again inside one
// inbox unit of work") and wraps the first run's error, so the delivery is
// classified as that error and ends as if the retry middleware were not
// there. router.Add applies it to every
// handler; wrap your handler with it (or ReentryNoPublish) when you compose
// the stages yourself: it must wrap the handler itself, inside every
// middleware. Outside an inbox it only calls h.
func Reentry(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		u, ok := unitOf(msg.Context())
		if !ok {
			return h(msg)
		}
		if u.Calls.Add(1) > 1 {
			if u.FirstErr == nil {
				return nil, errHandlerReentered
			}
			return nil, fmt.Errorf("%w; its first run failed: %w", errHandlerReentered, u.FirstErr)
		}
		produced, err := h(msg)
		u.FirstErr = err
		return produced, err
	}
}

// ReentryNoPublish is Reentry for a handler that publishes nothing, as
// message.Router.AddConsumerHandler takes it.
func ReentryNoPublish(h message.NoPublishHandlerFunc) message.NoPublishHandlerFunc {
	guarded := Reentry(func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) })
	return func(msg *message.Message) error {
		_, err := guarded(msg)
		return err
	}
}
