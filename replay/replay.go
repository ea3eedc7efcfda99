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
//	ShutdownGrace → Trace → Replay → Poison → Retry → Brake → Classify → Inbox → handler
//
// It records after the stages inside returned, outside the inbox's
// transaction, at least once: a crash between the inbox's commit and the
// record leaves the item without an outcome until its redelivery, which the
// inbox turns into "duplicate" — recorded then. "processed" is never
// overwritten by "duplicate". A record that fails is logged; the delivery's
// own fate does not change.
package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/telemetry"
)

// Metadata keys the CLI sets on a replayed message (AMQP headers of the
// same names).
const (
	// RunKey is the replay run's id.
	RunKey = "sluice_replay_run"
	// ItemKey identifies the message within the run: the event id, else the
	// poison copy's message id, cut to ItemMaxLength (Item).
	ItemKey = "sluice_replay_item"
)

// Metrics of the stage, by handler (sluice.handler).
const (
	// MetricOutcomes counts the outcomes the stage recorded, by
	// sluice.outcome: a rise of "poisoned" while a replay runs is the
	// closed loop's stop signal, seen from the consumers.
	MetricOutcomes = "sluice.replay.outcomes"
	// MetricRecordFailures counts the records the Store refused or did not
	// take within RecordTimeout: their items stay without an outcome (and
	// `sluice dlq replay` waits out --wait) until redelivered.
	MetricRecordFailures = "sluice.replay.record_failures"
)

// AttrOutcome is the outcome attribute of MetricOutcomes.
const AttrOutcome = attribute.Key("sluice.outcome")

// Bounds of the run and item ids in the records.
const (
	RunMaxLength  = 128
	ItemMaxLength = 256
)

// Item is id as an item: cut to ItemMaxLength bytes on a character
// boundary. The CLI's header and record and the stage's record all use it,
// so a long event id names one item, not two.
func Item(id string) string { return diag.Bound(id, ItemMaxLength) }

// The outcomes the operator's CLI records, besides the consumers'.
const (
	// OutcomeReplayed: sent by dlq replay, nothing heard back yet.
	OutcomeReplayed sluice.Outcome = "replayed"
	// OutcomeArchived: moved out of the poison queue by dlq archive.
	OutcomeArchived sluice.Outcome = "archived"
	// OutcomeDiscarded: removed for good by dlq discard, with a reason.
	OutcomeDiscarded sluice.Outcome = "discarded"
	// OutcomeCompensated: repaired by hand, as dlq resolve records it.
	OutcomeCompensated sluice.Outcome = "compensated"
)

// Final reports whether an outcome ends a dead letter's story: processed,
// duplicate, rejected, poisoned (again), archived, discarded or
// compensated. Retried, parked, held, requeued, failed and replayed are on the way.
func Final(o sluice.Outcome) bool {
	switch o {
	case sluice.OutcomeProcessed, sluice.OutcomeDuplicate, sluice.OutcomeRejected, sluice.OutcomePoisoned,
		OutcomeArchived, OutcomeDiscarded, OutcomeCompensated:
		return true
	}
	return false
}

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

// Store keeps the records. SQLStore is one; replay/redisstore's is another.
type Store interface {
	// Record upserts r by (Run, Item); "duplicate" does not replace
	// "processed" or "rejected".
	Record(ctx context.Context, r Record) error
}

// Ledger is a Store the operator's CLI can read back and write to: the
// closed loop's record of what it sent, the outcomes, and the operator's own
// records. SQLStore and replay/redisstore's Store are Ledgers.
type Ledger interface {
	Store
	// Replayed records that the CLI sent items of a run (outcome
	// "replayed"), unless an outcome for them is already there.
	Replayed(ctx context.Context, rs []Record) error
	// Records inserts or replaces rs: the operator's records (archived,
	// discarded, compensated), which replace whatever was there.
	Records(ctx context.Context, rs []Record) error
	// Outcomes returns the records of run, or of every run when run is
	// empty, ordered by run and item.
	Outcomes(ctx context.Context, run string) ([]Record, error)
	// Items returns the records of run's items given, those there are, in
	// any order: what the closed loop polls for a batch, without reading
	// the whole run each time.
	Items(ctx context.Context, run string, items []string) ([]Record, error)
}

// ItemsChunk bounds the items one query of Items names.
const ItemsChunk = 500

// Defaults.
const (
	RecordTimeoutDefault = 5 * time.Second
	ReasonMaxLength      = 1024
)

// Config configures New.
type Config struct {
	// Store receives the records. Required.
	Store Store
	// RecordTimeout bounds one record, on a context detached from the
	// handler's. Default RecordTimeoutDefault.
	RecordTimeout time.Duration
	// Logger receives a line per record that failed. Default
	// watermill.NopLogger; router.Add gives the router's.
	Logger watermill.LoggerAdapter
	// MeterProvider receives MetricOutcomes and MetricRecordFailures.
	// Default the global provider; router.Add gives the stages' one.
	MeterProvider metric.MeterProvider
	// Tx, when the outcome table lives in the inbox's database, returns the
	// inbox's transaction: give sqlstore.TxFromContext, and a *SQLStore as
	// Store. "processed" is then written in that transaction, with the
	// claim and the business writes (InTx, which router.Middlewares puts
	// inside the inbox): it exists exactly when they do.
	Tx func(context.Context) *sqlx.Tx
	// Signer, when set, verifies the replay run and item (and the CLI's
	// provenance, sluice_replay*): believed only when the CLI signed them
	// with the same key (sluice dlq replay --signing-key-file), else
	// removed — the delivery is processed, its outcome not recorded. Give
	// the poison and retry stages the same one (router.Stages.Signer does).
	// Default nil: a deployment
	// without a key believes the run and item of any delivery, so its
	// outcome records are only as trustworthy as what may publish into the
	// queue (docs/architecture.md, "Trust boundary").
	Signer *sluice.Signer
}

func isReplayKey(k string) bool { return strings.HasPrefix(k, sluice.ReplayPrefix) }

// New returns the stage. Deliveries without RunKey pass through untouched.
func New(cfg Config) (message.HandlerMiddleware, error) {
	if cfg.Store == nil {
		return nil, errors.New("replay: Config.Store is required")
	}
	if _, ok := cfg.Store.(*SQLStore); cfg.Tx != nil && !ok {
		return nil, errors.New("replay: Config.Tx needs a *SQLStore as Config.Store (the outcome table in the inbox's database)")
	}
	if cfg.RecordTimeout == 0 {
		cfg.RecordTimeout = RecordTimeoutDefault
	}
	if cfg.RecordTimeout < 0 {
		return nil, fmt.Errorf("replay: Config.RecordTimeout must be positive, got %s", cfg.RecordTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	meter := telemetry.Meter(cfg.MeterProvider)
	outcomes, err := meter.Int64Counter(MetricOutcomes, metric.WithDescription("Outcomes of replayed deliveries the replay stage recorded, by outcome."))
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	failures, err := meter.Int64Counter(MetricRecordFailures, metric.WithDescription("Outcome records of replayed deliveries that could not be written."))
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if cfg.Signer != nil {
				if removed := cfg.Signer.Believe(msg, isReplayKey); removed != nil {
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
				r.Reason = diag.Summary(err, ReasonMaxLength)
			case sluice.OutcomePoisoned:
				r.Reason = diag.Bound(report.Reason, ReasonMaxLength)
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.RecordTimeout)
			defer cancel()
			if rErr := cfg.Store.Record(rctx, r); rErr != nil {
				failures.Add(rctx, 1, telemetry.HandlerAttr(msg))
				cfg.Logger.Error("Recording the replay outcome failed; the item stays without it until redelivered", diag.RedactError(rErr),
					telemetry.LogFields(msg, watermill.LogFields{"run": r.Run, "item": r.Item, "outcome": string(r.Outcome)}))
			} else {
				outcomes.Add(rctx, 1, metric.WithAttributes(telemetry.HandlerKey.String(telemetry.Handler(ctx)), AttrOutcome.String(string(r.Outcome))))
			}
			return produced, err
		}
	}, nil
}

// InTx returns the inner half of the stage for Config.Tx: placed inside the
// inbox (router.Middlewares does), it writes "processed" for a replayed
// delivery whose handler succeeded, in the inbox's transaction, so the
// outcome commits with the claim and the business writes or not at all. A
// write that fails fails the delivery as Transient (the transaction rolls
// back). Without Config.Tx it returns nil.
func InTx(cfg Config) (message.HandlerMiddleware, error) {
	if cfg.Tx == nil {
		return nil, nil
	}
	store, ok := cfg.Store.(*SQLStore)
	if !ok {
		return nil, errors.New("replay: Config.Tx needs a *SQLStore as Config.Store (the outcome table in the inbox's database)")
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			produced, err := h(msg)
			run, item := msg.Metadata.Get(RunKey), msg.Metadata.Get(ItemKey)
			if err != nil || run == "" || item == "" {
				return produced, err
			}
			ctx := msg.Context()
			tx := cfg.Tx(ctx)
			if tx == nil {
				return produced, nil
			}
			if rErr := store.RecordTx(ctx, tx, recordOf(msg, run, item, sluice.OutcomeProcessed)); rErr != nil {
				return nil, sluice.Transient(fmt.Errorf("replay: recording the outcome in the inbox's transaction: %w", rErr))
			}
			return produced, nil
		}
	}, nil
}

// recordOf is msg's record of run and item: bounded, named by its handler.
func recordOf(msg *message.Message, run, item string, o sluice.Outcome) Record {
	return Record{Run: diag.Bound(run, RunMaxLength), Item: Item(item), EventID: diag.Bound(msg.Metadata.Get(sluice.EventIDKey), ItemMaxLength),
		Outcome: o, Handler: telemetry.Handler(msg.Context()), At: time.Now().UTC()}
}
