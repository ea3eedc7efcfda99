package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Run is one operator's action on a poison queue — a replay (its closed
// loop), a discard, an archive — as it was started and as it ended, kept
// where its items' outcomes are: so that any console shows any run, one
// the CLI started or one from before a console's restart.
type Run struct {
	ID       string    `json:"id"`
	Kind     string    `json:"kind"`     // "replay", "discard", "archive"
	Queue    string    `json:"queue"`    // the poison queue
	Group    string    `json:"group"`    // the failure group it selected, "" for another selection
	Selected string    `json:"selected"` // the selection, as dlq.Filter.Describe words it
	Operator string    `json:"operator"`
	Source   string    `json:"source"` // "console", "cli"
	Started  time.Time `json:"started"`
	Ended    time.Time `json:"ended,omitzero"` // zero while it runs
	Stopped  bool      `json:"stopped,omitempty"`
	Err      string    `json:"err,omitempty"`
	// Count is how many messages it selected, Moved how many it replayed,
	// discarded or archived.
	Count int `json:"count"`
	Moved int `json:"moved"`
	// Batches are the closed loop's batches and their verdicts, as
	// package dlq encodes them (dlq.Batch): the store keeps them as they
	// are, at most RunBatchesMaxBytes.
	Batches json.RawMessage `json:"batches,omitempty"`
}

// RunBatchesMaxBytes bounds Run.Batches: SaveRun keeps a run's batches only
// up to it.
const RunBatchesMaxBytes = 64 << 10

// Runs is a Ledger that also keeps the runs: replay/sqlstore's and
// replay/redisstore's are. The closed loop (dlq.Queue.ClosedLoop) and the
// console save their runs in a Ledger that is one; a console reads them
// back for its run pages and its recent actions.
type Runs interface {
	// SaveRun inserts or replaces the run of r.ID.
	SaveRun(ctx context.Context, r Run) error
	// Run returns the run of id; ok is false when there is none.
	Run(ctx context.Context, id string) (r Run, ok bool, err error)
	// RecentRuns returns the limit runs started last, newest first.
	RecentRuns(ctx context.Context, limit int) ([]Run, error)
}

// SaveRun saves r in store when store keeps runs (Runs), and does nothing
// otherwise.
func SaveRun(ctx context.Context, store Ledger, r Run) error {
	if rs, ok := store.(Runs); ok {
		if len(r.Batches) > RunBatchesMaxBytes {
			r.Batches = nil // the outcomes stay; the batches are in the audit log
		}
		return rs.SaveRun(ctx, r)
	}
	return nil
}

// MarshalRun is r as a store keeps it: JSON.
func MarshalRun(r Run) ([]byte, error) { return json.Marshal(r) }

// UnmarshalRun reads the run of id a store kept (MarshalRun).
func UnmarshalRun(id string, b []byte) (Run, error) {
	var r Run
	if err := json.Unmarshal(b, &r); err != nil {
		return Run{}, fmt.Errorf("ledger: run %q: %w", id, err)
	}
	return r, nil
}
