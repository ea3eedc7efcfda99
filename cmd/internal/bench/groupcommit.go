package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicemq/sluice/deduplication"
)

// groupCommitMaxBatch and groupCommitMaxWait are deduplication.BatchConfig's
// defaults (MaxBatch 8, MaxWait 2 ms), what a zero BatchConfig runs with.
const (
	groupCommitMaxBatch = 8
	groupCommitMaxWait  = 2 * time.Millisecond
)

// gcVariant is one way of running the stack in the groupcommit suite.
type gcVariant struct {
	name  string
	noop  bool
	batch *deduplication.BatchConfig
}

// gcLatencyRate is the publish rate of the latency runs: well under what one
// subscription commits without batching, so that the latency is the
// stack's, not a queue's.
const gcLatencyRate = 400

// GroupCommit prints P8: the full stack on Sluice's Consumer (router.Add on
// a rabbitmq.NewBroker; Trace, Poison, Retry, Classify, Inbox, Recoverer;
// one business INSERT per delivery) over a queue preloaded with
// o.Messages*4 messages, with the inbox's group commit
// (deduplication.Config.Batch) against one transaction per delivery and
// against a no-op handler on the same broker (what the broker delivers at
// all), at 1 and 4 subscriptions and prefetch 16 and 64, variants
// interleaved round after round. Then the latency from publish to commit
// (the stack returned) at gcLatencyRate messages per second, with and
// without batching.
func GroupCommit(ctx context.Context, o Options) error {
	g, err := newGCRunner(ctx, o, "sluice_bench_gc")
	if err != nil {
		return err
	}
	defer g.Close()

	n := o.Messages * 4
	rounds := max(o.Rounds/4, 3)
	variants := []gcVariant{
		{name: "no-op handler", noop: true},
		{name: "one transaction per delivery"},
		{name: "batch 8, 2ms (default)", batch: &deduplication.BatchConfig{}},
		{name: "batch 8, 2ms, linger", batch: &deduplication.BatchConfig{Linger: true}},
		{name: "batch 16, 2ms", batch: &deduplication.BatchConfig{MaxBatch: 16}},
		{name: "batch 16, 2ms, linger", batch: &deduplication.BatchConfig{MaxBatch: 16, Linger: true}},
		{name: "batch 32, 2ms", batch: &deduplication.BatchConfig{MaxBatch: 32}},
		{name: "batch 4, 2ms", batch: &deduplication.BatchConfig{MaxBatch: 4}},
	}
	var rows [][]string
	for _, prefetch := range []int{rabbitmqPrefetch, 64} {
		for _, subs := range []int{1, 4} {
			rates := make([][]float64, len(variants))
			sizes := make([]gcResult, len(variants))
			for round := range rounds {
				for k := range variants {
					i := (k + round) % len(variants)
					res, err := g.run(ctx, gcCase{n: n, subs: subs, prefetch: prefetch, noop: variants[i].noop, batch: variants[i].batch},
						fmt.Sprintf("p%d-s%d-r%d-v%d-", prefetch, subs, round, i))
					if err != nil {
						return fmt.Errorf("%s, prefetch %d, %d subscriptions: %w", variants[i].name, prefetch, subs, err)
					}
					rates[i] = append(rates[i], res.handled)
					sizes[i].batches += res.batches
					sizes[i].batched += res.batched
					sizes[i].maxBatch = max(sizes[i].maxBatch, res.maxBatch)
				}
			}
			for i, vr := range variants {
				row := []string{strconv.Itoa(prefetch), strconv.Itoa(subs), vr.name, f0(Median(rates[i])), "", f2(MedianRatio(rates[i], rates[0])), "", ""}
				if !vr.noop {
					row[4] = f2(MedianRatio(rates[i], rates[1]))
				}
				if vr.batch != nil {
					row[6], row[7] = gcMeanBatch(sizes[i].batches, sizes[i].batched), strconv.FormatInt(sizes[i].maxBatch, 10)
				}
				rows = append(rows, row)
			}
		}
	}
	fmt.Fprintf(o.Out, "P8: group commit, the full stack on Sluice's Consumer (RabbitMQ + PostgreSQL), %d messages preloaded per run, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"prefetch", "subscriptions", "variant", "msg/s", "÷ one tx per delivery", "÷ no-op", "mean batch", "max batch"}, rows)
	fmt.Fprintln(o.Out, "targets: batching ÷ one transaction per delivery ≥ 2 at 1 and 4 subscriptions; ÷ no-op (the broker's consume rate) ≥ 0.5")
	fmt.Fprintln(o.Out)
	if err := gcCeiling(ctx, o, g.v, n, rounds); err != nil {
		return err
	}
	return gcLatency(ctx, o, g)
}

// gcCeiling prints what PostgreSQL gives group commit on this machine, with
// no broker and no stack: the statements of one delivery (a claim and one
// business INSERT) in a transaction per delivery, against the statements
// of a batch (BEGIN, per delivery the store's ClaimAfter — the savepoint
// before released, the next set, the claim — and the INSERT, then
// COMMIT), and against a batch without savepoints (what group commit
// could send if a failing delivery did not have to roll back alone), at
// the same number of deliveries in flight as the consumer keeps (16: one
// subscription of the default prefetch; 64: four, or one of prefetch 64;
// 256: four of prefetch 64): window ÷ batch size transactions side by
// side, on the suite's pool of 24 connections.
func gcCeiling(ctx context.Context, o Options, v *inboxVariants, n, rounds int) error {
	variants := []struct {
		size       int
		savepoints bool
	}{{1, false}, {4, true}, {8, true}, {16, true}, {8, false}, {16, false}}
	var rows [][]string
	for _, window := range []int{rabbitmqPrefetch, 4 * rabbitmqPrefetch, 256} {
		timedOut := make([]atomic.Int64, len(variants))
		rates, err := rotate(ctx, rounds, len(variants), v.truncate, func(round, i int) (float64, error) {
			size := variants[i].size
			run := fmt.Sprintf("ceiling-w%d-r%d-v%d-", window, round, i)
			if size == 1 {
				return Throughput(ctx, window, n, v.byHand(run))
			}
			r, err := Throughput(ctx, window/size, n/size, v.batchOf(run, size, variants[i].savepoints, &timedOut[i]))
			return r * float64(size), err
		})
		if err != nil {
			return fmt.Errorf("ceiling, %d in flight: %w", window, err)
		}
		for i, vr := range variants {
			name := "one transaction per delivery"
			switch {
			case vr.size > 1 && vr.savepoints:
				name = fmt.Sprintf("batches of %d", vr.size)
			case vr.size > 1:
				name = fmt.Sprintf("batches of %d, no savepoints", vr.size)
			}
			rows = append(rows, []string{strconv.Itoa(window), name, strconv.Itoa(window / vr.size), f0(Median(rates[i])), f2(MedianRatio(rates[i], rates[0])),
				strconv.FormatInt(timedOut[i].Load(), 10)})
		}
	}
	fmt.Fprintf(o.Out, "P8's ceiling: PostgreSQL alone (no broker, no stack), the statements of one transaction per delivery against those of a batch, the same deliveries in flight, %d deliveries per run, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"in flight", "variant", "transactions side by side", "deliveries/s", "÷ one tx per delivery", "claims past 1 ms"}, rows)
	fmt.Fprintln(o.Out, "the batch ÷ one transaction per delivery here bounds what group commit can give end to end on this machine")
	fmt.Fprintln(o.Out)
	return nil
}

// gcLatency prints publish → commit latency at gcLatencyRate with and
// without batching, next to what one commit costs on an idle connection.
func gcLatency(ctx context.Context, o Options, g *gcRunner) error {
	n := max(o.Messages*2, 20)
	rounds := max(o.Rounds/4, 3)
	variants := []gcVariant{{name: "one transaction per delivery"},
		{name: fmt.Sprintf("batch %d, %s (defaults)", groupCommitMaxBatch, groupCommitMaxWait), batch: &deduplication.BatchConfig{}}}
	var rows [][]string
	for _, subs := range []int{1, 4} {
		lat := make([][]time.Duration, len(variants))
		sizes := make([]gcResult, len(variants))
		for round := range rounds {
			for k := range variants {
				i := (k + round) % len(variants)
				res, err := g.run(ctx, gcCase{n: n, subs: subs, batch: variants[i].batch, rate: gcLatencyRate},
					fmt.Sprintf("lat-s%d-r%d-v%d-", subs, round, i))
				if err != nil {
					return fmt.Errorf("latency, %s, %d subscriptions: %w", variants[i].name, subs, err)
				}
				lat[i] = append(lat[i], res.lat...)
				sizes[i].batches += res.batches
				sizes[i].batched += res.batched
			}
		}
		for i, vr := range variants {
			added, mean := "", ""
			if vr.batch != nil {
				added, mean = gcMs(pct(lat[i], 99)-pct(lat[0], 99)), gcMeanBatch(sizes[i].batches, sizes[i].batched)
			}
			rows = append(rows, []string{strconv.Itoa(subs), vr.name, strconv.Itoa(len(lat[i])), gcMs(pct(lat[i], 50)), gcMs(pct(lat[i], 99)), added, mean})
		}
	}
	commit, err := gcOneCommit(ctx, g.v)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "P8: latency from publish to commit, %d messages published at %d/s per run (prefetch %d), %d rounds interleaved, percentiles over all rounds\n\n",
		n, gcLatencyRate, rabbitmqPrefetch, rounds)
	Table(o.Out, []string{"subscriptions", "variant", "deliveries", "p50", "p99", "added p99", "mean batch"}, rows)
	fmt.Fprintf(o.Out, "one commit (BEGIN, one INSERT, COMMIT) on an idle connection: median %s; target: added p99 ≤ MaxWait (%s) + one commit = %s\n",
		gcMs(commit), groupCommitMaxWait, gcMs(groupCommitMaxWait+commit))
	return nil
}

// gcOneCommit is the median time of 200 transactions of one INSERT, one at a
// time.
func gcOneCommit(ctx context.Context, v *inboxVariants) (time.Duration, error) {
	ds := make([]time.Duration, 200)
	for i := range ds {
		start := time.Now()
		if err := v.plainKey(ctx, "commit-"+strconv.Itoa(i)); err != nil {
			return 0, err
		}
		ds[i] = time.Since(start)
	}
	slices.Sort(ds)
	return cmp.Or(ds[len(ds)/2], time.Nanosecond), nil
}

// gcMs formats d in milliseconds, two decimals.
func gcMs(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + " ms"
}
