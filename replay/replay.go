// Package replay closes the loop of a recovery: a message replayed from a
// poison queue (sluice dlq replay) carries its replay run and item
// (RunKey, ItemKey); the stage records what became of it — processed,
// duplicate, rejected, retried into a tier, poisoned again with the new
// reason, parked, held, failed — in a Store the operator's CLI reads back
// (sluice dlq replay --canary/--ramp waits on it, sluice dlq report prints
// it).
//
// The stage sits inside Trace and outside Poison, so it sees the delivery's
// final fate for this attempt:
//
//	ShutdownGrace → Trace → Replay → Order → Poison → Retry → Brake → Classify → Inbox → Recoverer → handler
//
// It records after the stages inside returned, at least once: a crash
// between the inbox's commit and the record leaves the item without an
// outcome until its redelivery, which the inbox turns into "duplicate" —
// recorded then. "processed" is never overwritten by "duplicate". A record
// that fails is logged; the delivery's own fate does not change. With
// Config.InUnitOfWork and a store that is a UnitOfWorkRecorder, "processed"
// is written inside the inbox's transaction instead (InTx, which
// router.Middlewares places inside the inbox): it exists exactly when the
// claim and the business writes do.
package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/envsigner"
	"github.com/sluicemq/sluice/internal/inherit"
	"github.com/sluicemq/sluice/internal/metakeys"
	"github.com/sluicemq/sluice/internal/telemetry"
	"github.com/sluicemq/sluice/unitofwork"
)

// Metadata keys the CLI sets on a replayed message (AMQP headers of the
// same names).
const (
	// RunKey is the replay run's id, cut to 128 bytes in the records.
	RunKey = "sluice_replay_run"
	// ItemKey identifies the message within the run: the event id, else the
	// poison copy's message id, cut to ItemMaxLength (as the operator's CLI names it).
	ItemKey = "sluice_replay_item"
)

// ItemMaxLength bounds the item and event ids in the records, in bytes.
const ItemMaxLength = 256

// runMaxLength bounds the run ids in the records, in bytes.
const runMaxLength = 128

// Record is what became of one replayed item.
type Record struct {
	Run     string         `json:"run" db:"run"`
	Item    string         `json:"item" db:"item"`
	EventID string         `json:"event_id" db:"event_id"`
	Outcome sluice.Outcome `json:"outcome" db:"outcome"`
	Class   string         `json:"class,omitempty" db:"class"`
	Reason  string         `json:"reason,omitempty" db:"reason"`
	// Handler is the consumer that recorded it; for the CLI's records,
	// "operator <name>".
	Handler string    `json:"handler,omitempty" db:"handler"`
	At      time.Time `json:"at" db:"updated_at"`
}

// Store keeps the records. sluicesql.Outcomes and sluiceredis.Outcomes are
// two; the operator's CLI reads them back as a replay/ledger.Ledger.
type Store interface {
	// Record upserts r by (Run, Item); "duplicate" does not replace
	// "processed" or "rejected".
	Record(ctx context.Context, r Record) error
}

// UnitOfWorkRecorder is a Store that can also write a record in the inbox's
// unit of work, the one the context of a delivery inside the inbox carries
// (sluicesql.Outcomes', in the inbox's SQL transaction, when its table is in
// the inbox's database). Config.InUnitOfWork needs one.
type UnitOfWorkRecorder interface {
	Store
	// RecordInUnitOfWork writes r, as Record does, in the unit of work ctx
	// carries, so that it commits or rolls back with it. It returns an
	// error matching unitofwork.ErrMissing, having written nothing, when
	// ctx carries none it can join (no inbox, or an inbox on another
	// store): InTx then leaves the record to the stage, after the stack
	// returns.
	RecordInUnitOfWork(ctx context.Context, r Record) error
}

// reasonMaxLength bounds a record's Reason, in bytes.
const reasonMaxLength = 1024

// recordTimeoutDefault is Config.StoreTimeout's default: a record's bound.
const recordTimeoutDefault = 5 * time.Second

// Config configures New.
type Config struct {
	// Store receives the records. Required.
	Store Store
	// Env is the shared environment (router.Stages and service give theirs;
	// the fields set here win). The stage reads Logger, a line per record
	// that failed (default watermill.NopLogger; router.Add gives the
	// router's); MeterProvider, which receives sluice.replay.outcomes and
	// sluice.replay.record_failures (default the global provider); Signer,
	// which, when set, verifies the replay run and item (and the CLI's
	// provenance, sluice_replay*): believed only when the CLI signed them
	// with the same key for this consumer's queue (sluice dlq replay
	// --signing-key-file signs for the queue it replays to; a retry copy of a
	// replayed delivery is signed for it again), else removed — the delivery
	// is processed, its outcome not recorded. A replayed delivery a handler
	// forwards to another queue records nothing there. Give the poison and
	// retry stages the same one (router.Stages.Env does). Without one, a
	// deployment believes the run and item of any delivery, so its outcome
	// records are only as trustworthy as what may publish into the queue
	// (docs/architecture.md, "Trust boundary"); StoreTimeout, which bounds
	// one record, on a context detached from the handler's (default 5 s).
	sluice.Env
	// InUnitOfWork, when the records live with the inbox (sluicesql.Outcomes on
	// the inbox's database), writes "processed" in the inbox's unit of work,
	// with the claim and the business writes (InTx, which router.Middlewares
	// puts inside the inbox): it exists exactly when they do. Store must be
	// a UnitOfWorkRecorder. Default false: every outcome is recorded after
	// the stack returns.
	InUnitOfWork bool
	// Queue is the consumer's queue the run and item are verified for
	// (Signer). Default: the topic the Watermill handler subscribed to (on
	// RabbitMQ, the queue); router.Add gives the poison stage's Queue.
	Queue string
	// Tiers are the queues a copy of this consumer's comes back from (the
	// retry tiers' topics; router.Add gives them): a copy signed before
	// signatures named their queue (signing.ErrUnboundSignature) is believed
	// only when it came back from one of them. Default none.
	Tiers []string
}

func isReplayKey(k string) bool { return strings.HasPrefix(k, metakeys.ReplayPrefix) }

// withDefaults returns a copy of c with its defaults filled.
func (c Config) withDefaults() Config {
	c.StoreTimeout = cmp.Or(c.StoreTimeout, recordTimeoutDefault)
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	return c
}

// validate checks a Config with its defaults filled.
func (c Config) validate() error {
	if c.Store == nil {
		return errors.New("replay: Config.Store is required")
	}
	if _, err := unitOfWork(c); err != nil {
		return err
	}
	if c.StoreTimeout < 0 {
		return fmt.Errorf("replay: %s must not be negative, got %s: a negative StoreTimeout is the inbox's alone", inherit.Field("StoreTimeout"), c.StoreTimeout)
	}
	return nil
}

// New returns the stage. Deliveries without RunKey pass through untouched.
func New(cfg Config) (message.HandlerMiddleware, error) {
	cfg = cfg.withDefaults()
	var keyed bool
	cfg.Signer, keyed = envsigner.Of(cfg.Signer)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	meter := telemetry.Meter(cfg.MeterProvider)
	outcomes, err := meter.Int64Counter(telemetry.MetricReplayOutcomes, metric.WithDescription("Outcomes of replayed deliveries the replay stage recorded, by outcome."))
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	failures, err := meter.Int64Counter(telemetry.MetricReplayRecordFailures, metric.WithDescription("Outcome records of replayed deliveries that could not be written."))
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if keyed {
				queue := cmp.Or(cfg.Queue, message.SubscribeTopicFromCtx(msg.Context()))
				if removed := cfg.Signer.Believe(msg, isReplayKey, queue, cfg.Tiers...); removed != nil {
					cfg.Logger.Info("Replay run not signed by the operator's CLI: not believed, no outcome recorded",
						telemetry.LogFields(msg, watermill.LogFields{"removed": strings.Join(removed, ",")}))
				}
			}
			run, item := msg.Metadata.Get(RunKey), msg.Metadata.Get(ItemKey)
			if run == "" || item == "" {
				return h(msg)
			}
			ctx := msg.Context()
			report := sluice.ReportFromContext(ctx)
			if report == nil {
				var rctx context.Context
				rctx, report = sluice.WithReport(ctx)
				msg.SetContext(rctx)
				defer msg.SetContext(ctx)
			}
			produced, err := h(msg)
			r := recordOf(msg, run, item, report.Settle(err))
			if report.Class.Valid() {
				r.Class = report.Class.String()
			}
			switch r.Outcome {
			case sluice.OutcomeFailed:
				r.Reason = diag.Summary(err, reasonMaxLength)
			case sluice.OutcomePoisoned, sluice.OutcomeProcessed:
				// Processed: a stage's note, if any (the ordering stage's:
				// applied out of its key's order).
				r.Reason = diag.Bound(report.Reason, reasonMaxLength)
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.StoreTimeout)
			defer cancel()
			if rErr := cfg.Store.Record(rctx, r); rErr != nil {
				failures.Add(rctx, 1, telemetry.DeliveryAttr(msg))
				cfg.Logger.Error("Recording the replay outcome failed; the item stays without it until redelivered", diag.RedactError(rErr),
					telemetry.LogFields(msg, watermill.LogFields{"run": r.Run, "item": r.Item, "outcome": string(r.Outcome)}))
			} else {
				outcomes.Add(rctx, 1, metric.WithAttributes(telemetry.DeliveryAttrs(ctx, telemetry.AttrOutcome.String(string(r.Outcome)))...))
			}
			return produced, err
		}
	}, nil
}

// InTx returns the inner half of the stage for Config.InUnitOfWork: placed
// inside the inbox (router.Middlewares does), it writes "processed" for a
// replayed delivery whose handler succeeded, in the inbox's unit of work, so
// the outcome commits with the claim and the business writes or not at all.
// A write that fails fails the delivery as Transient (the transaction rolls
// back); where the store finds no unit of work (unitofwork.ErrMissing) the stage
// records after the stack returns, as without it. Without
// Config.InUnitOfWork it returns nil, nil.
func InTx(cfg Config) (message.HandlerMiddleware, error) {
	store, err := unitOfWork(cfg)
	if store == nil || err != nil {
		return nil, err
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			produced, err := h(msg)
			run, item := msg.Metadata.Get(RunKey), msg.Metadata.Get(ItemKey)
			if err != nil || run == "" || item == "" {
				return produced, err
			}
			rec := recordOf(msg, run, item, sluice.OutcomeProcessed)
			if report := sluice.ReportFromContext(msg.Context()); report != nil {
				rec.Reason = diag.Bound(report.Reason, reasonMaxLength) // a stage's note, if any
			}
			rErr := store.RecordInUnitOfWork(msg.Context(), rec)
			if rErr != nil && !errors.Is(rErr, unitofwork.ErrMissing) {
				return nil, sluice.Transient(fmt.Errorf("replay: recording the outcome in the inbox's unit of work: %w", rErr))
			}
			return produced, nil
		}
	}, nil
}

// unitOfWork is cfg.Store as a UnitOfWorkRecorder when cfg.InUnitOfWork
// asks for one, nil when it does not, an error when the store is none.
func unitOfWork(cfg Config) (UnitOfWorkRecorder, error) {
	if !cfg.InUnitOfWork {
		return nil, nil
	}
	store, ok := cfg.Store.(UnitOfWorkRecorder)
	if !ok {
		return nil, fmt.Errorf("replay: Config.InUnitOfWork needs a Config.Store that can record in the inbox's unit of work (a replay.UnitOfWorkRecorder such as sluicesql.Outcomes'), got %T", cfg.Store)
	}
	return store, nil
}

// recordOf is msg's record of run and item: bounded, named by its handler.
func recordOf(msg *message.Message, run, item string, o sluice.Outcome) Record {
	return Record{Run: diag.Bound(run, runMaxLength), Item: diag.Bound(item, ItemMaxLength), EventID: diag.Bound(msg.Metadata.Get(sluice.EventIDKey), ItemMaxLength),
		Outcome: o, Handler: telemetry.Handler(msg.Context()), At: time.Now().UTC()}
}
