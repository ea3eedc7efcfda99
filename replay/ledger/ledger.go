// Package ledger is the operator's view of the replay stage's outcome
// records: the Ledger that `sluice dlq replay` (its closed loop), `report`,
// `resolve`, `archive` and `discard` read and write, the runs it keeps, the
// outcomes only the operator's CLI records, and Final, which tells the
// outcomes that end a dead letter's story. A consumer needs none of it: its
// stack takes a replay.Store. The stores of sluicesql.Outcomes and
// sluiceredis.Outcomes are Ledgers; replay/replaytest is the suite a Ledger
// passes.
package ledger

import (
	"context"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/replay"
)

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

// TableDefault is the outcome records' default name, which the CLI's
// --outcomes-table reads by default: sluicesql.Outcomes' table, and with a
// colon sluiceredis.Outcomes's key prefix.
const TableDefault = "sluice_replay"

// Ledger is a replay.Store the operator's CLI can read back and write to:
// the closed loop's record of what it sent, the outcomes, and the
// operator's own records.
type Ledger interface {
	replay.Store
	// Replayed records that the CLI sent items of a run (outcome
	// "replayed"), unless an outcome for them is already there.
	Replayed(ctx context.Context, rs []replay.Record) error
	// Records inserts or replaces rs: the operator's records (archived,
	// discarded, compensated), which replace whatever was there.
	Records(ctx context.Context, rs []replay.Record) error
	// Outcomes returns the records of run, or of every run when run is
	// empty, ordered by run and item.
	Outcomes(ctx context.Context, run string) ([]replay.Record, error)
	// Items returns the records of run's items given, those there are, in
	// any order: what the closed loop polls for a batch, without reading
	// the whole run each time.
	Items(ctx context.Context, run string, items []string) ([]replay.Record, error)
}

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
