package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// run is one action the console started: a replay (a closed loop, in the
// background), a discard, an archive. Its rows are the outcome column:
// each item with its latest outcome, at most rowsMax of them.
type run struct {
	ID, Kind, Queue, Group, Operator string
	Started                          time.Time

	mu      sync.Mutex
	rows    []*row
	byItem  map[string]*row
	more    int // items past rowsMax
	batches []dlq.Batch
	done    bool
	ended   time.Time
	result  dlq.Result
	err     string
	stopped bool
}

type row struct {
	// Name is the item as every page names its dead letter (dlq.RecordName).
	Item, EventID, Name, Outcome, Class, Reason string
}

func (c *Console) newRun(kind, id, queue, group, operator string) *run {
	ru := &run{ID: id, Kind: kind, Queue: queue, Group: group, Operator: diag.Printable(operator, textMax), Started: time.Now(), byItem: map[string]*row{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs[id] = ru
	c.order = append(c.order, id)
	if len(c.order) > runsMax {
		delete(c.runs, c.order[0])
		c.order = c.order[1:]
	}
	return ru
}

func (ru *run) add(item, eventID, outcome, class, reason string) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	ru.set(item, eventID, outcome, class, reason)
}

func (ru *run) set(item, eventID, outcome, class, reason string) {
	r, ok := ru.byItem[item]
	if !ok {
		if len(ru.rows) >= rowsMax {
			ru.more++
			return
		}
		r = &row{Item: item}
		ru.byItem[item] = r
		ru.rows = append(ru.rows, r)
	}
	r.EventID = diag.Printable(cmp.Or(eventID, item), textMax)
	r.Name = dlq.RecordName(replay.Record{Item: item, EventID: eventID})
	r.Outcome = diag.Printable(outcome, 32)
	r.Class = diag.Printable(class, 64)
	r.Reason = diag.Printable(reason, textMax)
}

func (ru *run) batch(b dlq.Batch) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	for _, r := range b.Records {
		ru.set(r.Item, r.EventID, string(r.Outcome), r.Class, r.Reason)
	}
	b.Records, b.Bad = nil, nil // the rows have them
	ru.batches = append(ru.batches, b)
}

func (ru *run) finish(res dlq.Result, err error) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	ru.done, ru.ended, ru.result = true, time.Now(), res
	if err != nil {
		ru.err = diag.Summary(err, reasonMax)
		ru.stopped = errors.Is(err, dlq.ErrStopped)
	}
}

// runView is a run as its page shows it.
type runView struct {
	ID, Kind, Queue, Group, Operator string
	Source                           string // "console", "cli": who started it, for a run read back
	Started, Ended                   time.Time
	Done, Stopped                    bool
	Err                              string
	Result                           dlq.Result
	Batches                          []dlq.Batch
	Rows                             []row
	More                             int
	Counts                           map[string]int
}

func (ru *run) view() runView {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	v := runView{ID: ru.ID, Kind: ru.Kind, Queue: diag.Printable(ru.Queue, 255), Group: ru.Group, Operator: ru.Operator, Started: ru.Started,
		Ended: ru.ended, Done: ru.done, Stopped: ru.stopped, Err: ru.err, Result: ru.result, Batches: slices.Clone(ru.batches), More: ru.more,
		Counts: map[string]int{}}
	for _, r := range ru.rows {
		v.Rows = append(v.Rows, *r)
		v.Counts[r.Outcome]++
	}
	return v
}

// recentRuns are the last runs: this console's and, when the outcome
// records keep runs (ledger.Runs), those any console or the CLI started —
// newest first, ten.
func (c *Console) recentRuns(ctx context.Context) []runView {
	c.mu.Lock()
	ids := slices.Clone(c.order)
	c.mu.Unlock()
	var out []runView
	seen := map[string]bool{}
	for i := len(ids) - 1; i >= 0 && len(out) < recentMax; i-- {
		c.mu.Lock()
		ru := c.runs[ids[i]]
		c.mu.Unlock()
		if ru != nil {
			v := ru.view()
			v.Rows = nil
			out = append(out, v)
			seen[v.ID] = true
		}
	}
	if rs, ok := c.cfg.Outcomes.(ledger.Runs); ok {
		var stored []ledger.Run
		err := c.storeCall(ctx, "reading the recent runs", func(ctx context.Context) (err error) { stored, err = rs.RecentRuns(ctx, recentMax); return err })
		if err == nil {
			for _, r := range stored {
				if !seen[r.ID] {
					out = append(out, storedView(r))
				}
			}
		}
	}
	slices.SortStableFunc(out, func(a, b runView) int { return b.Started.Compare(a.Started) })
	return out[:min(len(out), recentMax)]
}

// recentMax is how many runs the overview lists.
const recentMax = 10

// storedView is a run the outcome records kept, as its page shows it
// (without its rows: runPage reads them).
func storedView(r ledger.Run) runView {
	return runView{ID: diag.Printable(r.ID, textMax), Kind: diag.Printable(r.Kind, 32), Queue: diag.Printable(r.Queue, 255),
		Group: diag.Printable(r.Group, textMax), Operator: diag.Printable(r.Operator, textMax), Source: diag.Printable(r.Source, 32),
		Started: r.Started, Ended: r.Ended, Done: !r.Ended.IsZero(), Stopped: r.Stopped, Err: diag.Printable(r.Err, reasonMax),
		Result: dlq.Result{Selected: r.Count, Replayed: r.Moved}, Batches: batchesOf(r), Counts: map[string]int{}}
}

// batchesOf decodes a saved run's batches (ledger.Run.Batches: the
// dlq.Batch values a closed loop saved, as JSON).
func batchesOf(r ledger.Run) []dlq.Batch {
	var bs []dlq.Batch
	_ = json.Unmarshal(r.Batches, &bs)
	return bs
}

// keep saves a discard's or an archive's run, once it ended, where its
// outcomes are (a replay's closed loop saves its own): any console shows
// it then.
func (c *Console) keep(ctx context.Context, ru *run) {
	v := ru.view()
	r := ledger.Run{ID: v.ID, Kind: v.Kind, Queue: ru.Queue, Group: v.Group, Operator: v.Operator, Source: "console",
		Started: v.Started.UTC(), Ended: v.Ended.UTC(), Stopped: v.Stopped, Err: v.Err, Count: v.Result.Selected, Moved: v.Result.Replayed}
	if c.cfg.Outcomes == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = replayledger.SaveRun(ctx, c.cfg.Outcomes, r) // the audit log has the run too
}

// runPage shows a run: its batches and the outcome column, read live from
// the outcome records while the run goes on (the page reloads itself).
func (c *Console) runPage(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	ru := c.runs[r.PathValue("run")]
	c.mu.Unlock()
	if ru == nil {
		v, err := c.storedRun(r.Context(), r.PathValue("run"))
		if err != nil {
			c.fail(w, r, http.StatusNotFound, err)
			return
		}
		c.render(w, r, "run", v)
		return
	}
	if c.cfg.Outcomes != nil && ru.Kind == "replay" {
		ru.mu.Lock()
		var items []string
		for _, row := range ru.rows {
			if !ledger.Final(sluice.Outcome(row.Outcome)) {
				items = append(items, row.Item)
			}
		}
		ru.mu.Unlock()
		if len(items) > 0 {
			var rs []replay.Record
			if err := c.storeCall(r.Context(), "reading the run's outcomes", func(ctx context.Context) (err error) {
				rs, err = c.cfg.Outcomes.Items(ctx, ru.ID, items)
				return err
			}); err == nil {
				ru.mu.Lock()
				for _, rec := range rs {
					if old := ru.byItem[rec.Item]; old == nil || !ledger.Final(sluice.Outcome(old.Outcome)) {
						ru.set(rec.Item, rec.EventID, string(rec.Outcome), rec.Class, rec.Reason)
					}
				}
				ru.mu.Unlock()
			}
		}
	}
	c.render(w, r, "run", ru.view())
}

// storedRun is the page of a run this console did not start, or started
// before it restarted: read from the outcome records (ledger.Runs), its
// rows their records of the run.
func (c *Console) storedRun(ctx context.Context, id string) (runView, error) {
	rs, ok := c.cfg.Outcomes.(ledger.Runs)
	if !ok {
		return runView{}, errors.New("no such run in this console's memory, and its outcome records keep no runs (give it --outcomes; the audit log and `sluice dlq report` have every run)")
	}
	var (
		r     ledger.Run
		found bool
	)
	err := c.storeCall(ctx, "reading the run", func(ctx context.Context) (err error) { r, found, err = rs.Run(ctx, id); return err })
	if err != nil {
		return runView{}, fmt.Errorf("reading the run: %w", diag.RedactError(err))
	}
	if !found {
		return runView{}, errors.New("no such run in the outcome records (the audit log and `sluice dlq report` have every run)")
	}
	v := storedView(r)
	var recs []replay.Record
	err = c.storeCall(ctx, "reading the run's outcomes", func(ctx context.Context) (err error) { recs, err = c.cfg.Outcomes.Outcomes(ctx, id); return err })
	if err != nil {
		return runView{}, fmt.Errorf("reading the run's outcomes: %w", diag.RedactError(err))
	}
	tmp := &run{byItem: map[string]*row{}}
	for _, rec := range recs {
		tmp.set(rec.Item, rec.EventID, string(rec.Outcome), rec.Class, rec.Reason)
	}
	for _, row := range tmp.rows {
		v.Rows = append(v.Rows, *row)
		v.Counts[row.Outcome]++
	}
	v.More = tmp.more
	return v, nil
}
