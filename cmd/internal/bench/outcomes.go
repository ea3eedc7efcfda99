package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicemq/sluice/replay"

	"github.com/sluicemq/sluice/sluicesql"
)

// outcomeRuns is how many records the outcomes suite's run holds: a
// recovery of that many events.
const outcomeRuns = 100_000

// Outcomes prints what one poll of a closed-loop batch costs the inbox's
// database: reading the batch's 100 records (ledger.Ledger.Items, what
// `sluice dlq replay` does) against reading the whole run of 100,000
// (Outcomes, what it did before), on PostgreSQL.
func Outcomes(ctx context.Context, o Options) error {
	db, schema, cleanup, err := pgSchema(ctx, o.PostgresURL, "sluice_bench_outcomes", 4, nil)
	if err != nil {
		return err
	}
	defer cleanup()
	store, err := sluicesql.NewOutcomes(db, sluicesql.OutcomesConfig{Table: schema + ".sluice_replay"})
	if err != nil {
		return err
	}
	if err := store.CreateTable(ctx); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.sluice_replay (run, item, event_id, outcome, updated_at)
		SELECT 'run-1', 'evt-' || lpad(g::text, 6, '0'), 'evt-' || lpad(g::text, 6, '0'), 'processed', now()
		FROM generate_series(1, %d) g`, schema, outcomeRuns)); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "VACUUM ANALYZE "+schema+".sluice_replay"); err != nil {
		return err
	}
	batch := make([]string, 100) // the last batch of the run
	for i := range batch {
		batch[i] = fmt.Sprintf("evt-%06d", outcomeRuns-len(batch)+i+1)
	}
	fmt.Fprintf(o.Out, "Closed-loop polls on PostgreSQL: a batch of %d in a run of %d records\n\n", len(batch), outcomeRuns)
	polls := func(v int) Op {
		return func(ctx context.Context, _ int) error {
			var rs []replay.Record
			var err error
			if v == 0 {
				rs, err = store.Items(ctx, "run-1", batch)
			} else {
				rs, err = store.Outcomes(ctx, "run-1")
			}
			if err == nil && len(rs) < len(batch) {
				err = fmt.Errorf("read %d records, want at least %d", len(rs), len(batch))
			}
			return err
		}
	}
	start := time.Now()
	rates, err := Interleave(ctx, Options{Rounds: max(o.Rounds/2, 3), Messages: 20}, 1, 2, func(_, v int) Op { return polls(v) }, nil)
	if err != nil {
		return err
	}
	Table(o.Out, []string{"polls/s", "the batch (Items)", "the whole run (Outcomes)", "ratio"}, [][]string{
		{"", f0(Median(rates[0])), f2(Median(rates[1])), f0(MedianRatio(rates[0], rates[1]))},
	})
	fmt.Fprintf(o.Out, "(%s) each 200 ms poll of a batch used to read the whole run\n", time.Since(start).Round(time.Second))
	return nil
}
