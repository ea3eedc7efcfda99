package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicemq/sluice/sluicesql"
)

// InboxScale prints P6 on PostgreSQL: the claim rate (begin, claim a new
// key, commit) with o.ScaleRows rows already in the inbox against an empty
// inbox, and the p99 claim latency while the pruner deletes a tenth of those
// rows (old ones) against the same table without pruning.
func InboxScale(ctx context.Context, o Options) error {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench_scale", 16, nil)
	if err != nil {
		return err
	}
	defer cleanup()
	empty, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".empty"})
	if err != nil {
		return err
	}
	big, err := sluicesql.NewInbox(db, sluicesql.InboxConfig{Table: schema + ".big"})
	if err != nil {
		return err
	}
	for _, s := range []*sluicesql.Inbox{empty, big} {
		if err := s.CreateTable(ctx); err != nil {
			return err
		}
	}
	rows, old := o.ScaleRows, o.ScaleRows/10
	start := time.Now()
	// A tenth are 30 days old (what the pruner deletes), the rest recent;
	// keys spread like real event ids.
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.big (consumer, event_key, processed_at)
		SELECT 'inventory', md5(g::text), CASE WHEN g <= %d THEN now() - interval '30 days' ELSE now() END
		FROM generate_series(1, %d) g`, schema, old, rows)); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "VACUUM ANALYZE "+schema+".big"); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "P6: the inbox at scale on PostgreSQL (%d rows loaded in %s)\n\n", rows, time.Since(start).Round(time.Second))

	const conc = 8
	n := o.Messages * 4
	claim := func(s *sluicesql.Inbox, run string) Op {
		return func(ctx context.Context, i int) error {
			tx, err := s.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Claim(ctx, "inventory", run+strconv.Itoa(i)); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		}
	}
	rates, err := Interleave(ctx, Options{Rounds: max(o.Rounds/2, 3), Messages: n}, conc, 2, func(round, v int) Op {
		return claim([]*sluicesql.Inbox{empty, big}[v], fmt.Sprintf("r%d-", round))
	}, nil)
	if err != nil {
		return err
	}
	Table(o.Out, []string{"claims/s, 8 concurrent", "empty inbox", fmt.Sprintf("%d rows", rows), "ratio"}, [][]string{
		{"", f0(Median(rates[0])), f0(Median(rates[1])), f2(MedianRatio(rates[1], rates[0]))},
	})
	fmt.Fprintln(o.Out, "target: ≥ 0.8")

	// p99 claim latency on the big table, without and with the pruner.
	window := 15 * time.Second
	base, err := latencies(ctx, conc, window, claim(big, "base-"), nil)
	if err != nil {
		return err
	}
	p, err := sluicesql.NewPruner(sluicesql.PrunerConfig{Store: big, Retention: 7 * 24 * time.Hour})
	if err != nil {
		return err
	}
	var pruned atomic.Int64
	pruneStart := time.Now()
	during, err := latencies(ctx, conc, 10*time.Minute, claim(big, "prune-"), func(ctx context.Context) {
		n, _ := p.Prune(ctx)
		pruned.Add(n)
	})
	pruneTime := time.Since(pruneStart)
	if err != nil {
		return err
	}
	fmt.Fprintln(o.Out)
	Table(o.Out, []string{"claim latency, 8 concurrent", "claims", "p50", "p99", "p99 ÷ baseline"}, [][]string{
		{"baseline (" + window.String() + ", no pruning)", strconv.Itoa(len(base)), pct(base, 50).String(), pct(base, 99).String(), ""},
		{fmt.Sprintf("while the pruner deletes %d old rows (%s)", pruned.Load(), pruneTime.Round(time.Second)), strconv.Itoa(len(during)), pct(during, 50).String(), pct(during, 99).String(),
			f2(float64(pct(during, 99)) / float64(pct(base, 99)))},
	})
	fmt.Fprintln(o.Out, "target: p99 while pruning ≤ 2 × baseline")
	return nil
}

// latencies runs op on conc goroutines for window, or — with background —
// until background returns (at most window), and returns every op's latency.
func latencies(ctx context.Context, conc int, window time.Duration, op Op, background func(context.Context)) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	if background != nil {
		bgDone := make(chan struct{})
		go func() { defer close(bgDone); defer cancel(); background(ctx) }()
		defer func() { <-bgDone }()
	}
	var mu sync.Mutex
	var all []time.Duration
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	for range conc {
		wg.Go(func() {
			var mine []time.Duration
			for ctx.Err() == nil {
				start := time.Now()
				if err := op(ctx, int(next.Add(1))); err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					break
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	return all, <-errs
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(10 * time.Microsecond)
}
