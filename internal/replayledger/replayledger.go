// Package replayledger holds the helpers Sluice's own packages share around
// replay/ledger: how an item and a run are named, how a run's records are
// counted, and how a run is saved and kept. A user of the ledger needs none of them.
package replayledger

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// ItemsChunk bounds the items one query of a Ledger's Items names.
const ItemsChunk = 500

// RunBatchesMaxBytes bounds ledger.Run.Batches: SaveRun keeps a run's
// batches only up to it.
const RunBatchesMaxBytes = 64 << 10

// ReasonMaxLength bounds the Reason of an operator's record (archived,
// discarded, compensated) in bytes, as the replay stage bounds its own.
const ReasonMaxLength = 1024

// Item is id as an item: cut to replay.ItemMaxLength bytes on a character
// boundary, as the stage cuts the ItemKey it records. The CLI's header and
// record use it, so a long event id names one item, not two.
func Item(id string) string { return diag.Bound(id, replay.ItemMaxLength) }

// NewRun returns a new run id: kind, the time, and a random tail
// ("run-20260105T120000Z-3f2a9c1b"). The CLI and the console name their
// runs (replays, archives, discards) with it alike.
func NewRun(kind string) string {
	return kind + "-" + time.Now().UTC().Format("20060102T150405Z") + "-" + watermill.NewShortUUID()[:8]
}

// Count returns how many of items (of run) have a final outcome
// (ledger.Final), and how many of those were poisoned again.
func Count(rs []replay.Record, items map[string]bool) (final, poisoned int) {
	for _, r := range rs {
		if items[r.Item] && ledger.Final(r.Outcome) {
			final++
			if r.Outcome == sluice.OutcomePoisoned {
				poisoned++
			}
		}
	}
	return final, poisoned
}

// SaveRun saves r in store when store keeps runs (ledger.Runs), and does
// nothing otherwise.
func SaveRun(ctx context.Context, store ledger.Ledger, r ledger.Run) error {
	if rs, ok := store.(ledger.Runs); ok {
		if len(r.Batches) > RunBatchesMaxBytes {
			r.Batches = nil // the outcomes stay; the batches are in the audit log
		}
		return rs.SaveRun(ctx, r)
	}
	return nil
}

// MarshalRun is r as a store keeps it: JSON.
func MarshalRun(r ledger.Run) ([]byte, error) { return json.Marshal(r) }

// UnmarshalRun reads the run of id a store kept (MarshalRun).
func UnmarshalRun(id string, b []byte) (ledger.Run, error) {
	var r ledger.Run
	if err := json.Unmarshal(b, &r); err != nil {
		return ledger.Run{}, fmt.Errorf("ledger: run %q: %w", id, err)
	}
	return r, nil
}
