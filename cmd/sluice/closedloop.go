package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/dlq"
	"github.com/sluicemq/sluice/internal/bounded"
	"github.com/sluicemq/sluice/internal/diag"
	"github.com/sluicemq/sluice/replay"
	"github.com/sluicemq/sluice/replay/ledger"
)

// listMax bounds the events a stop lists; the report lists them all.
const listMax = 50

// reasonMaxLength bounds the Reason of an operator's record, in bytes, as
// the replay stage and the console bound theirs (1 KiB).
const reasonMaxLength = 1024

// loopFlags are the closed-loop flags of replay.
type loopFlags struct {
	outcomes    string
	table       string
	canary      int
	ramp        string
	maxRepoison string
	wait        time.Duration
}

func (l *loopFlags) active() bool { return l.canary > 0 || l.ramp != "" }

// sizes returns the batch sizes: the canary, then the ramp.
func (l *loopFlags) sizes() ([]int, float64, error) {
	var sizes []int
	if l.canary < 0 {
		return nil, 0, usageError{fmt.Errorf("--canary must be positive, got %d", l.canary)}
	}
	if l.canary > 0 {
		sizes = append(sizes, l.canary)
	}
	if l.ramp != "" {
		for _, p := range strings.Split(l.ramp, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n < 1 {
				return nil, 0, usageError{fmt.Errorf("--ramp %q: want batch sizes such as 5,20,100", l.ramp)}
			}
			sizes = append(sizes, n)
		}
	}
	maxRepoison := 0.1
	if l.maxRepoison != "" {
		v, err := strconv.ParseFloat(strings.TrimSuffix(l.maxRepoison, "%"), 64)
		if err != nil || v < 0 || v > 100 {
			return nil, 0, usageError{fmt.Errorf("--max-repoison %q: want a percentage such as 10%%", l.maxRepoison)}
		}
		maxRepoison = v / 100
	}
	if l.outcomes == "" {
		return nil, 0, usageError{errors.New("--canary and --ramp need --outcomes (the database the consumers' replay stage records into)")}
	}
	if err := checkOutcomesURL(l.outcomes); err != nil {
		return nil, 0, err
	}
	if l.wait <= 0 {
		return nil, 0, usageError{fmt.Errorf("--wait must be positive, got %s", l.wait)}
	}
	return sizes, maxRepoison, nil
}

// closedLoop runs q.ClosedLoop and prints each batch: its counts and, on
// a stop, why and every item of the batch that did not end well.
func closedLoop(ctx context.Context, q *dlq.Queue, cfg dlq.ReplayConfig, l dlq.Loop, out io.Writer) (dlq.Result, error) {
	fmt.Fprintf(out, "replay run %s\n", cfg.Run)
	l.Batch = func(b dlq.Batch) {
		copies := ""
		if b.Events != b.Replayed {
			copies = fmt.Sprintf(" (%d events)", b.Events)
		}
		fmt.Fprintf(out, "batch %d (%s, %d): %d replayed%s, %d with a final outcome, %d poisoned again\n",
			b.Step, b.Stage, b.Size, b.Replayed, copies, b.Final, b.Poisoned)
		if b.Stopped == "" {
			return
		}
		fmt.Fprintf(out, "stopped: %s\n", b.Stopped)
		for i, r := range b.Bad {
			if i == listMax {
				fmt.Fprintf(out, "  … and %d more\n", len(b.Bad)-listMax)
				break
			}
			fmt.Fprintf(out, "  %s\t%s\t%s\t%s\n", dlq.RecordName(r), diag.Printable(string(r.Outcome), 32), diag.Printable(r.Class, 32), diag.Printable(r.Reason, 200))
		}
		fmt.Fprintf(out, "see: sluice dlq report --outcomes ... --run %s\n", cfg.Run)
	}
	l.Source = "cli"
	return q.ClosedLoop(ctx, cfg, l)
}

// operatorRecords records, when --outcomes was given, what an operator's
// command did to each item, under a run of its own ("archive-…",
// "discard-…", "resolve-…").
type operatorRecords struct {
	url, table string
	g          *globals
	rs         []replay.Record
	// create makes a missing outcome table (archive, discard: a run of their
	// own); resolve records into an existing run's table.
	create bool
}

func (o *operatorRecords) add(outcome sluice.Outcome, item, eventID, class, reason string) {
	if o.url == "" {
		return
	}
	o.rs = append(o.rs, replay.Record{Item: item, EventID: eventID, Outcome: outcome, Class: class,
		Reason: diag.Bound(reason, reasonMaxLength), Handler: "operator " + o.g.operator, At: time.Now().UTC()})
}

// flush writes the records under run and returns it, or "" when there was
// nothing to write.
func (o *operatorRecords) flush(ctx context.Context, run string) (string, error) {
	if o.url == "" || len(o.rs) == 0 {
		return "", nil
	}
	store, closeStore, err := openOutcomes(ctx, o.url, o.table, o.create) // ctx: flush's, not cut by Ctrl-C (what was done is recorded)
	if err != nil {
		return "", err
	}
	defer closeStore()
	for i := range o.rs {
		o.rs[i].Run = run
	}
	if err := writeRecords(ctx, store, o.rs, storeTimeout); err != nil {
		return "", err
	}
	return run, nil
}

// writeRecords writes rs into store, within bound and ctx.
func writeRecords(ctx context.Context, store ledger.Ledger, rs []replay.Record, bound time.Duration) error {
	err := bounded.Within(ctx, bound, "writing the records", func(ctx context.Context) error { return store.Records(ctx, rs) })
	if err != nil {
		return fmt.Errorf("recording the outcomes (the audit log has them): %w", diag.RedactError(err))
	}
	return nil
}
