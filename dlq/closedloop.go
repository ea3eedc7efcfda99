package dlq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/internal/replayledger"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// ErrStopped ends a closed-loop replay that stopped on its own rule (the
// canary not processed, a ramp batch poisoned again past its share, no
// outcome within the wait).
var ErrStopped = errors.New("replay stopped")

// storeCall runs f, one call to a store (the outcome records, an
// archive's or a restore's table), with ctx ended after callTimeout: the
// context of a command (an interrupt's) does not end by itself.
func storeCall(ctx context.Context, what string, f func(context.Context) error) error {
	return bounded.Within(ctx, callTimeout, what, f)
}

// Loop is a closed-loop replay's plan.
type Loop struct {
	Sizes       []int // the canary's, then the ramp's; the last repeats
	Canary      bool  // Sizes[0] is a canary: it must come back all processed
	MaxRepoison float64
	Store       ledger.Ledger
	Wait        time.Duration // for each batch's outcomes
	Where       string        // the records' place, for a message ("table T", "key prefix P:"); "": not named
	// Batch, when set, is told of each batch once its outcomes are in (or
	// its wait passed), before the next starts.
	Batch func(Batch)
	// Source names who runs the loop ("cli", "console") in the run the
	// loop keeps in Store when Store keeps runs (ledger.Runs): saved as it
	// starts, after each batch and as it ends, so any console shows it.
	Source string
}

// Batch is one batch of a closed-loop replay, as its outcomes came back.
type Batch struct {
	Step     int    `json:"step"`  // from 1
	Stage    string `json:"stage"` // "canary" or "ramp"
	Size     int    `json:"size"`
	Replayed int    `json:"replayed"` // copies published
	Events   int    `json:"events"`   // items (two copies of one event are one item)
	Final    int    `json:"final"`    // items with a final outcome
	Poisoned int    `json:"poisoned"` // items poisoned again
	// Records are the run's records of this batch's items.
	Records []replay.Record `json:"-"`
	// Stopped says why the replay stops after this batch ("" goes on); Bad
	// are the batch's records that did not end processed or duplicate.
	Stopped string          `json:"stopped,omitempty"`
	Bad     []replay.Record `json:"-"`
}

// runClosedLoop is Queue.ClosedLoop on conn's queue (cfg.queue).
func runClosedLoop(ctx context.Context, conn *amqp.Connection, cfg ReplayConfig, l Loop) (res Result, err error) {
	if cfg.Run == "" || len(l.Sizes) == 0 || l.Store == nil || l.Wait <= 0 {
		return Result{ByTarget: map[string]int{}}, errors.New("dlq: a closed loop needs a run, batch sizes, an outcome store and a wait")
	}
	log := newRunLog(ctx, l.Store, "replay", l.Source, cfg)
	defer func() { log.end(ctx, res, err) }()
	batch := l.Batch
	l.Batch = func(b Batch) {
		log.batch(ctx, b)
		if batch != nil {
			batch(b)
		}
	}
	return closedLoop(ctx, conn, cfg, l)
}

func closedLoop(ctx context.Context, conn *amqp.Connection, cfg ReplayConfig, l Loop) (Result, error) {
	total := Result{ByTarget: map[string]int{}}
	cfg.Filter.NotRun = cfg.Run
	limit := cfg.Limit
	for step := 0; ; step++ {
		size := l.Sizes[min(step, len(l.Sizes)-1)]
		if limit > 0 {
			size = min(size, limit-total.Replayed)
			if size <= 0 {
				return total, nil
			}
		}
		items := map[string]bool{}
		c := cfg
		c.Limit = size
		c.Published = func(ctx context.Context, ms []*Message) error {
			rs := make([]replay.Record, len(ms))
			for i, m := range ms {
				items[m.Item()] = true
				rs[i] = replay.Record{Run: cfg.Run, Item: m.Item(), EventID: m.EventID, At: time.Now()}
			}
			if err := l.Store.Replayed(ctx, rs); err != nil {
				return err
			}
			if cfg.Published != nil {
				return cfg.Published(ctx, ms)
			}
			return nil
		}
		res, err := replayOn(ctx, conn, c)
		// Messages read: every batch reads the queue again from its head,
		// through what earlier batches left, so the messages read so far are
		// those replayed before and those this batch read.
		total.Scanned = max(total.Scanned, total.Replayed+res.Scanned)
		total.Selected += res.Selected
		total.Replayed += res.Replayed
		for k, v := range res.ByTarget {
			total.ByTarget[k] += v
		}
		if err != nil || res.Replayed == 0 {
			return total, err
		}
		stage := "ramp"
		if step == 0 && l.Canary {
			stage = "canary"
		}
		rs, err := awaitOutcomes(ctx, l.Store, cfg.Run, items, l.Wait)
		if err != nil {
			return total, err
		}
		b := judge(l, stage, step, size, res.Replayed, items, rs)
		l.Batch(b)
		if b.Stopped != "" {
			return total, fmt.Errorf("%w: %s (run %s)", ErrStopped, b.Stopped, cfg.Run)
		}
	}
}

// judge counts a batch's outcomes and decides whether the replay stops.
func judge(l Loop, stage string, step, size, replayed int, items map[string]bool, rs []replay.Record) Batch {
	// Counted by item: two copies of one event (a poisoning redelivered)
	// are one item with one outcome.
	n := len(items)
	final, poisoned := replayledger.Count(rs, items)
	b := Batch{Step: step + 1, Stage: stage, Size: size, Replayed: replayed, Events: n, Final: final, Poisoned: poisoned}
	badFinal, heard := 0, map[string]bool{}
	for _, r := range rs {
		if !items[r.Item] {
			continue
		}
		b.Records = append(b.Records, r)
		if r.Outcome != ledger.OutcomeReplayed {
			heard[r.Item] = true // a consumer recorded something
		}
		if r.Outcome != sluice.OutcomeProcessed && r.Outcome != sluice.OutcomeDuplicate {
			b.Bad = append(b.Bad, r)
			if ledger.Final(r.Outcome) {
				badFinal++
			}
		}
	}
	silent := n - len(heard) // items still only "replayed": no consumer's record
	rate := float64(poisoned) / float64(n)
	// The records' place and the CLI's flags, or, with no place to name (a
	// console mounted without OutcomesWhere), neither.
	place, table := "the outcome records this replay reads", "S.sluice_replay"
	if l.Where != "" {
		place, table = l.Where+" of --outcomes", "--outcomes-table S.sluice_replay"
	}
	noStage := fmt.Sprintf("does the consumer run the replay stage (router.Stages.Replay) recording into %s? (a service.New with Config.Schema S records into %s)", place, table)
	switch {
	case silent == n:
		b.Stopped = fmt.Sprintf("no outcome recorded within --wait %s for any of the %d events: %s", l.Wait, n, noStage)
	case stage == "canary" && badFinal > 0:
		b.Stopped = fmt.Sprintf("%d of the %d canary events were not processed", badFinal, n)
	case final < n && silent > 0:
		b.Stopped = fmt.Sprintf("%d of %d events had no final outcome within --wait %s, %d with no outcome recorded at all: %s", n-final, n, l.Wait, silent, noStage)
	case final < n:
		b.Stopped = fmt.Sprintf("%d of %d events had no final outcome within --wait %s", n-final, n, l.Wait)
	case rate > l.MaxRepoison:
		b.Stopped = fmt.Sprintf("%.0f%% poisoned again, more than --max-repoison %.0f%%", 100*rate, 100*l.MaxRepoison)
	}
	return b
}

// awaitOutcomes polls the store until every item has a final outcome, or
// wait passes; it returns the run's records of those items.
func awaitOutcomes(ctx context.Context, store ledger.Ledger, run string, items map[string]bool, wait time.Duration) ([]replay.Record, error) {
	deadline := time.Now().Add(wait)
	keys := slices.Collect(maps.Keys(items))
	for {
		var rs []replay.Record
		err := storeCall(ctx, "the outcome records", func(ctx context.Context) (err error) { rs, err = store.Items(ctx, run, keys); return err })
		if err != nil {
			return nil, fmt.Errorf("reading the outcomes: %w", diag.RedactError(err))
		}
		if final, _ := replayledger.Count(rs, items); final == len(items) || time.Now().After(deadline) {
			return rs, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
