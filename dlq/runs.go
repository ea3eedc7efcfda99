package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/replay/ledger"
)

// saveTimeout bounds each save of a run.
const saveTimeout = 5 * time.Second

// runLog keeps a run in the outcome records as it goes (ledger.Runs), for
// whichever console shows it: saved when it starts, after each batch and
// when it ends. A save that fails loses only the run's page: the outcomes
// and the audit log have the run.
type runLog struct {
	store   ledger.Ledger
	run     ledger.Run
	batches []Batch
}

// newRunLog starts the run of kind id over cfg's selection in store.
func newRunLog(ctx context.Context, store ledger.Ledger, kind, source string, cfg ReplayConfig) *runLog {
	l := &runLog{store: store, run: ledger.Run{ID: cfg.Run, Kind: kind, Queue: cfg.queue, Group: cfg.Filter.Group,
		Selected: selection(cfg.Filter), Operator: diag.Bound(cfg.op.Operator, 256), Source: source, Started: time.Now().UTC()}}
	l.save(ctx)
	return l
}

// selection words a filter for a run's page: "class=poison group=3f2a…".
func selection(f Filter) string {
	d := f.Describe()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(d)) {
		parts = append(parts, k+"="+d[k])
	}
	return diag.Bound(strings.Join(parts, " "), 1024)
}

func (l *runLog) batch(ctx context.Context, b Batch) {
	l.batches = append(l.batches, b)
	l.save(ctx)
}

func (l *runLog) end(ctx context.Context, res Result, err error) {
	l.run.Ended, l.run.Count, l.run.Moved = time.Now().UTC(), res.Selected, res.Replayed
	if err != nil {
		l.run.Err, l.run.Stopped = diag.Summary(err, 2048), errors.Is(err, ErrStopped)
	}
	l.save(context.WithoutCancel(ctx)) // an interrupted run is saved as it ended
}

func (l *runLog) save(ctx context.Context) {
	if l.batches != nil {
		l.run.Batches, _ = json.Marshal(l.batches) // Records and Bad are not encoded: the outcomes have them
	}
	ctx, cancel := context.WithTimeout(ctx, saveTimeout)
	defer cancel()
	_ = replayledger.SaveRun(ctx, l.store, l.run)
}
