package bench

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/sluicemq/sluice/deduplication"
)

// ConsumerInbox prints P4 re-scoped: the full stack on Sluice's Consumer
// (one subscription, o.Prefetch in flight; the inbox on PostgreSQL, one
// business INSERT after the handler's work) over a queue preloaded with
// o.Messages*4 messages, all healthy against 10% failing transiently on
// their first attempt (parked in the 30 s tier, so they come back after the
// run), at 0, 1 and 3 ms of handler work, with and without group commit.
// It reports deliveries handled per second (healthy + parked) ÷ all
// healthy, and, next to it, the old figure: the healthy ones' rate ÷ all
// healthy (the consumer suite's, there without the inbox).
func ConsumerInbox(ctx context.Context, o Options) error {
	g, err := newGCRunner(ctx, o, "sluice_bench_p4")
	if err != nil {
		return err
	}
	defer g.Close()

	n := o.Messages * 4
	rounds := max(o.Rounds/4, 3)
	var rows [][]string
	for _, work := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond} {
		for _, batch := range []*deduplication.BatchConfig{nil, {}} {
			var healthyRuns, handled, healthy []float64
			for round := range rounds {
				for k := range 2 {
					failing := (k+round)%2 == 1
					res, err := g.run(ctx, gcCase{n: n, subs: 1, prefetch: o.Prefetch, batch: batch, work: work, failing: failing},
						fmt.Sprintf("w%d-b%d-r%d-f%d-", work.Milliseconds(), btoi(batch != nil), round, btoi(failing)))
					if err != nil {
						return err
					}
					if failing {
						handled, healthy = append(handled, res.handled), append(healthy, res.healthy)
					} else {
						healthyRuns = append(healthyRuns, res.handled)
					}
				}
			}
			inbox := "one transaction per delivery"
			if batch != nil {
				inbox = fmt.Sprintf("batch %d, %s (defaults)", groupCommitMaxBatch, groupCommitMaxWait)
			}
			rows = append(rows, []string{work.String(), inbox, f0(Median(healthyRuns)), f0(Median(handled)), f0(Median(healthy)),
				f2(MedianRatio(handled, healthyRuns)), f2(MedianRatio(healthy, healthyRuns))})
		}
	}
	fmt.Fprintf(o.Out, "P4, re-scoped: the full stack on Sluice's Consumer (1 subscription, prefetch %d), inbox on PostgreSQL, %d messages preloaded, %d rounds interleaved\n\n",
		cmp.Or(o.Prefetch, rabbitmqPrefetch), n, rounds)
	Table(o.Out, []string{"handler work", "inbox", "all healthy msg/s", "10% transient: handled/s (healthy + parked)", "10% transient: healthy/s",
		"handled ÷ all healthy", "old: healthy ÷ all healthy"}, rows)
	fmt.Fprintln(o.Out, "target: handled ÷ all healthy ≥ 0.9 at 0, 1 and 3 ms")
	return nil
}
