package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/unitofwork"
)

// errorMaxLength bounds the error recorded with a failed row, in bytes
// (Failed.Err).
const errorMaxLength = 1024

// Writer writes produced messages into the unit of work of the delivery
// being handled — the inbox's transaction ctx carries — so they are
// committed with the claim and the business writes, or not at all. The
// Relay publishes them after the commit. sluicesql.Outbox is one.
type Writer interface {
	// Publish writes msgs, to be published to topic, in the unit of work
	// ctx carries. It gives each message a message id (its UUID, a new one
	// when empty) and an event id (sluice.EventIDKey; the UUID when the
	// producer set none, a new one when it is the consumed delivery's,
	// copied with its metadata) as it writes it, so a message the relay
	// sends twice, and only such a message, is a duplicate for the
	// receiving inbox. It writes none of Sluice's control headers
	// (sluice.IsControlKey): a produced message starts its own history.
	// It returns an error matching unitofwork.ErrMissing outside one (no
	// inbox stage, or an inbox on another database), having written
	// nothing — a service that produces outside a consumer writes in its
	// own transaction instead (sluicesql.Outbox.Write) — and an error
	// matching unitofwork.ErrAborted when an earlier statement aborted
	// the transaction: the messages are then written with the claim alone
	// if the handler rejects the delivery (unitofwork.OnRecordAlone).
	Publish(ctx context.Context, topic string, msgs ...*message.Message) error
	// CheckInbox tells, when a handler is assembled, whether Publish can
	// write in the units of work of the inbox store — router.Add asks it,
	// so that an outbox beside an inbox it cannot join is refused at once,
	// not on every delivery. A Writer that can write beside any inbox
	// returns nil.
	CheckInbox(store deduplication.Store) error
}

// Handler adapts a handler that returns the messages it produces (a
// Watermill message.HandlerFunc, as router.HandlerConfig.PublishingHandler
// takes it) to one that writes them through w, to topic, in the inbox's
// unit of work — instead of Watermill publishing them after the stack
// returned, after the inbox committed, where a failed publish loses them.
// The messages of a handler that fails are written and rolled back with
// the rest; those of a rejection (sluice.Reject) commit with its claim.
// router.Add applies it when HandlerConfig.Outbox is set; wrap your handler
// with it, inside unitofwork.Reentry, when you compose the stages
// yourself.
func Handler(w Writer, topic string, h message.HandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		produced, err := h(msg)
		if len(produced) == 0 {
			return err
		}
		werr := w.Publish(msg.Context(), topic, produced...)
		switch {
		case werr == nil:
			return err
		case err != nil && errors.Is(werr, unitofwork.ErrAborted):
			// The handler's own statement aborted the transaction: its
			// error decides (a rejection commits the claim and, through
			// OnRecordAlone, these messages; anything else rolls back).
			return err
		case err != nil:
			// Not %w: the handler's rejection must not make the inbox
			// commit without the messages it produced.
			return fmt.Errorf("outbox: writing %d produced messages: %w (the handler returned: %v)", len(produced), werr, err) //nolint:errorlint // not %w: see above
		}
		return fmt.Errorf("outbox: writing %d produced messages: %w", len(produced), werr)
	}
}

// Row is one produced message waiting in the outbox.
type Row struct {
	// ID orders the rows: the relay takes the oldest first.
	ID int64
	// Topic is where the message goes.
	Topic string
	// Message carries the UUID, metadata and payload as written.
	Message *message.Message
	// Attempts counts the relay's failed publishes of it so far, the
	// uncounted ones (Failed.Uncounted: no broker answered) left out.
	Attempts int
	// CreatedAt is when it was written.
	CreatedAt time.Time
	// Age is how long ago it was written when Due took it, measured on one
	// clock — the database's, which wrote CreatedAt — so that a clock
	// skewed between the relay's host and the database does not skew the
	// relay's lag. Zero: the relay measures from CreatedAt on its own clock.
	Age time.Duration
	// Err, when set, says the row could not be read back as a message: the
	// relay keeps it aside (recorded failed, tried again later) without
	// publishing it.
	Err error
}

// Failed is a row the relay could not publish: it stays in the outbox with
// its error (at most 1,024 bytes), and is tried again at NextAttempt — or, when Dead, is set
// aside (with its error and the time) and tried no more until an operator
// requeues it.
type Failed struct {
	ID          int64
	Err         string
	NextAttempt time.Time
	Dead        bool
	// Uncounted: the failure spends none of the row's attempts
	// (RelayConfig.MaxAttempts) — no broker answered the publish
	// (unreachable: an outage kills no row), or the row failed beside
	// another that closed the channel and was given back untried. The
	// store records its error and NextAttempt and leaves Row.Attempts as
	// it was. A store written for v1.0.0, which counts every failure,
	// passes outboxtest.Run only once it reads this field.
	Uncounted bool
}

// Store is where a Relay reads the rows to publish. sluicesql.Outbox is
// one (PostgreSQL, SQLite).
type Store interface {
	// Due takes up to limit rows due for publishing, oldest first, leaving
	// out rows another relay holds: until the batch is finished or
	// released, no other relay takes them. After the first row it takes
	// rows up to maxBytes of payload and metadata (0: no bound), so a
	// relay's memory follows RelayConfig.BatchBytes, not BatchSize times
	// the largest message; a store that cannot bound by bytes takes up to
	// limit rows.
	Due(ctx context.Context, limit int, maxBytes int64) (Batch, error)
	// Stats counts what waits in the outbox.
	Stats(ctx context.Context) (Stats, error)
	// Wakeups signals, in-process, that rows were committed (the SQL
	// store's, from the inbox's OnCommit hook and its Wake method), so the
	// Relay publishes them without waiting for its poll. nil: the relay
	// polls (RelayConfig.PollInterval).
	Wakeups() <-chan struct{}
}

// Batch is a set of rows one relay holds.
type Batch interface {
	Rows() []Row
	// CutShort says the batch holds fewer rows than the limit Due was
	// asked for because maxBytes stopped it while more rows were due: the
	// relay takes the next batch at once instead of waiting
	// RelayConfig.PollInterval, as after a batch that found fewer rows due
	// than its limit.
	CutShort() bool
	// Finish deletes the relayed rows and records the failed ones, and
	// releases the batch. After a Finish that failed, the rows come back
	// (sent again: a duplicate for the receiver, never a loss).
	Finish(ctx context.Context, relayed []int64, failed []Failed) error
	// Release gives the rows back untouched.
	Release(ctx context.Context) error
}

// Stats is what waits in the outbox.
type Stats struct {
	// Pending counts every row not yet relayed, failing ones included,
	// dead ones not.
	Pending int64
	// Failing counts the pending rows whose last publish failed.
	Failing int64
	// Dead counts the rows set aside after RelayConfig.MaxAttempts failed
	// publishes: they wait for an operator (sluice outbox requeue|discard).
	Dead int64
	// Oldest is the oldest pending row's creation time; zero when there is
	// none.
	Oldest time.Time
	// OldestAge is the oldest pending row's age when Stats read it, on the
	// database's clock (see Row.Age); zero: measured from Oldest on the
	// relay's own clock.
	OldestAge time.Duration
}
