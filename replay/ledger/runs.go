package ledger

import (
	"context"
	"encoding/json"
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
	// are, up to 64 KiB (a run's larger batches are not kept: its
	// outcomes are).
	Batches json.RawMessage `json:"batches,omitempty"`
}

// Runs is a Ledger that also keeps the runs: sluicesql.Outcomes' and
// sluiceredis.Outcomes's are. The closed loop (dlq.Queue.ClosedLoop) and the
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
