package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/sluicemq/sluice/deduplication"
	"github.com/sluicemq/sluice/sluicesql"
)

// bhVariant is one way of running the stack in the batchhandler suite.
type bhVariant struct {
	name        string
	noop        bool
	batch       *deduplication.BatchConfig  // group commit
	handler     *deduplication.BatchHandler // a batch handler
	poisonEvery int                         // every n-th delivery fails as Poison
	size        func(prefetch int) int      // the batch handler's MaxBatch at a prefetch
}

// BatchHandlers prints B1: a projection (one business row per event) on the
// full stack on Sluice's Consumer (router.Add on rabbitmq.NewBroker; Trace,
// Poison, Retry, Classify and the inbox) over a preloaded queue, written by
// a batch handler (router.HandlerConfig.BatchHandler, one INSERT per batch)
// against group commit (one INSERT per delivery, deduplication.BatchConfig)
// and against a no-op handler on the same broker, at prefetch 16 and 64 (one
// subscription: Sluice's Consumer keeps its prefetch in flight), with 1% and
// 10% of the deliveries failing as Poison; variants interleaved round after
// round. Then the ceiling: PostgreSQL alone doing a batch's statements.
func BatchHandlers(ctx context.Context, o Options) error {
	g, err := newGCRunner(ctx, o, "sluice_bench_bh")
	if err != nil {
		return err
	}
	defer g.Close()

	n := o.Messages * 4
	rounds := max(o.Rounds/4, 3)
	half := func(p int) int { return max(p/2, 1) }
	whole := func(p int) int { return p }
	variants := []bhVariant{
		{name: "no-op handler", noop: true},
		{name: "group commit (defaults: 8, 2ms)", batch: &deduplication.BatchConfig{}},
		{name: "group commit, batch 16", batch: &deduplication.BatchConfig{MaxBatch: 16}},
		{name: "batch handler, MaxBatch prefetch/2", handler: &deduplication.BatchHandler{}, size: half},
		{name: "batch handler, MaxBatch prefetch", handler: &deduplication.BatchHandler{}, size: whole},
		{name: "batch handler, MaxBatch prefetch, 1% poison", handler: &deduplication.BatchHandler{}, size: whole, poisonEvery: 100},
		{name: "batch handler, MaxBatch prefetch, 10% poison", handler: &deduplication.BatchHandler{}, size: whole, poisonEvery: 10},
		{name: "group commit (defaults), 10% poison", batch: &deduplication.BatchConfig{}, poisonEvery: 10},
	}
	var rows [][]string
	noop := map[int]float64{}    // the no-op handler's median rate, by prefetch
	noopCPU := map[int]cpuCost{} // and its CPU per delivery
	for _, prefetch := range []int{16, 64} {
		rates := make([][]float64, len(variants))
		healthy := make([][]float64, len(variants))
		sizes := make([]gcResult, len(variants))
		cpus := make([][]cpuCost, len(variants))
		for round := range rounds {
			for k := range variants {
				i := (k + round) % len(variants)
				vr := variants[i]
				c := gcCase{n: n, subs: 1, prefetch: prefetch, noop: vr.noop, batch: vr.batch, poisonEvery: vr.poisonEvery,
					label: fmt.Sprintf("%s@%d", strings.ReplaceAll(vr.name, ",", ";"), prefetch)} // pprof's -tagfocus splits at commas
				if vr.handler != nil {
					bh := *vr.handler
					bh.MaxBatch = vr.size(prefetch)
					c.batchHandler = &bh
				}
				res, err := g.run(ctx, c, fmt.Sprintf("bh-p%d-r%d-v%d-", prefetch, round, i))
				if err != nil {
					return fmt.Errorf("%s, prefetch %d: %w", vr.name, prefetch, err)
				}
				rates[i] = append(rates[i], res.handled)
				cpus[i] = append(cpus[i], res.cpu)
				healthy[i] = append(healthy[i], res.healthy)
				sizes[i].batches += res.batches
				sizes[i].batched += res.batched
				sizes[i].maxBatch = max(sizes[i].maxBatch, res.maxBatch)
			}
		}
		noop[prefetch], noopCPU[prefetch] = Median(rates[0]), medianCost(cpus[0])
		for i, vr := range variants {
			name := vr.name
			if vr.handler != nil {
				name += " (" + strconv.Itoa(vr.size(prefetch)) + ")"
			}
			row := []string{strconv.Itoa(prefetch), name, f0(Median(rates[i])), f0(Median(healthy[i])), "", f2(MedianRatio(rates[i], rates[0])), "", ""}
			row = append(row, medianCost(cpus[i]).columns()...)
			if !vr.noop {
				row[4] = f2(MedianRatio(healthy[i], healthy[1]))
			}
			if !vr.noop {
				row[6], row[7] = gcMeanBatch(sizes[i].batches, sizes[i].batched), strconv.FormatInt(sizes[i].maxBatch, 10)
			}
			rows = append(rows, row)
		}
	}
	fmt.Fprintf(o.Out, "B1: batch handlers, a projection (one row per event) on the full stack on Sluice's Consumer (RabbitMQ + PostgreSQL), %d messages preloaded per run, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"prefetch", "variant", "msg/s", "healthy/s", "healthy ÷ group commit", "÷ no-op", "mean commit", "max commit", "CPU µs/msg", "of it here", "cores busy"}, rows)
	fmt.Fprintln(o.Out, "goals: batch handler ÷ group commit ≥ 2 at prefetch 16, ≥ 3 at 64; ÷ no-op (the broker's consume rate) ≥ 0.5")
	fmt.Fprintln(o.Out, "healthy/s: the deliveries that did not fail, until the last of them; mean/max commit: events (deliveries) per COMMIT")
	fmt.Fprintln(o.Out, "CPU µs/msg: the machine's CPU time (broker, PostgreSQL, this process) per delivery; of it here: this process's (the client and the stack); cores busy: the mean over the run")
	fmt.Fprintln(o.Out)
	return bhCeiling(ctx, o, g.v, n, rounds, noop, noopCPU)
}

// bhCeiling prints what PostgreSQL gives a batch handler with no broker and
// no stack: BEGIN, the store's ClaimBatch of the batch's keys, one INSERT
// of their rows, COMMIT — window ÷ size such transactions side by side —
// against one transaction per delivery (a claim, one INSERT); and each
// against noop, the no-op handler's rate on the broker at as many in flight
// (the same run): what the ÷ no-op goal could reach were the stack free.
func bhCeiling(ctx context.Context, o Options, v *inboxVariants, n, rounds int, noop map[int]float64, noopCPU map[int]cpuCost) error {
	var rows, bounds, turns [][]string
	for _, window := range []int{16, 64} {
		sizes := []int{1, window / 2, window}
		cpus := make([][]cpuCost, len(sizes))
		rates, err := rotate(ctx, rounds, len(sizes), v.truncate, func(round, i int) (float64, error) {
			size := sizes[i]
			run := fmt.Sprintf("bh-ceiling-w%d-r%d-v%d-", window, round, i)
			cpu0 := sampleCPU()
			if size == 1 {
				r, err := Throughput(ctx, window, n, v.byHand(run))
				cpus[i] = append(cpus[i], costSince(cpu0, n))
				return r, err
			}
			r, err := Throughput(ctx, window/size, n/size, v.claimedBatchOf(run, size))
			cpus[i] = append(cpus[i], costSince(cpu0, n/size*size))
			return r * float64(size), err
		})
		if err != nil {
			return fmt.Errorf("ceiling, %d in flight: %w", window, err)
		}
		for i, size := range sizes {
			name := "one transaction per delivery"
			if size > 1 {
				name = fmt.Sprintf("batches of %d: BEGIN, one claim, one INSERT, COMMIT", size)
			}
			vsNoop := ""
			if noop[window] > 0 {
				vsNoop = f2(Median(rates[i]) / noop[window])
			}
			rows = append(rows, append([]string{strconv.Itoa(window), name, strconv.Itoa(window / size), f0(Median(rates[i])), f2(MedianRatio(rates[i], rates[0])), vsNoop}, medianCost(cpus[i]).columns()...))
		}
		if c, d := noopCPU[window], medianCost(cpus[len(sizes)-1]); c.ok && d.ok {
			bounds = append(bounds, []string{strconv.Itoa(window), f1(c.machine), f1(d.machine), f2(c.machine / (c.machine + d.machine))})
		}
		if b := Median(rates[len(sizes)-1]); noop[window] > 0 && b > 0 {
			turns = append(turns, []string{strconv.Itoa(window), f0(1e6 * float64(window) / noop[window]), f0(1e6 * float64(window) / b), f2(b / (noop[window] + b))})
		}
	}
	fmt.Fprintf(o.Out, "B1's ceiling: PostgreSQL alone (no broker, no stack), a batch handler's statements, the same deliveries in flight, %d deliveries per run, %d rounds interleaved\n\n", n, rounds)
	Table(o.Out, []string{"in flight", "variant", "transactions side by side", "deliveries/s", "÷ one tx per delivery", "÷ no-op consume", "CPU µs/msg", "of it here", "cores busy"}, rows)
	fmt.Fprintln(o.Out, "the stack's batch handler ÷ this ceiling is what the broker, the stages and the gathering cost;")
	fmt.Fprintln(o.Out, "÷ no-op consume: this ceiling ÷ the no-op handler's rate above at as many in flight — below 0.5, the database alone cannot give the ÷ no-op goal there")
	bound(o.Out, "B1's CPU bound: a batch handler on the stack does what the no-op consume does and what the ceiling's batches do, on the same cores",
		[]string{"in flight", "no-op consume CPU µs/msg", "ceiling's batches CPU µs/msg", "÷ no-op at most, all cores busy"}, bounds,
		"÷ no-op at most: no-op ÷ (no-op + batches), the rate the two costs together leave where the no-op consume already keeps the cores busy (its cores busy above)")
	bound(o.Out, "B1's bound in turns: one batch holds the whole window (MaxBatch = in flight), so the broker sends the next window only once the batch is committed and acked — the broker's turn and the database's add up",
		[]string{"in flight", "the broker's turn µs (a window at the no-op rate)", "the database's turn µs (a batch of the window, PostgreSQL alone)", "÷ no-op at most, in turns"}, turns,
		"÷ no-op at most, in turns: broker ÷ (broker + database) = ceiling ÷ (no-op + ceiling), with the stack costing nothing; a batch of half the window lets two batches overlap the turns")
	return nil
}

// bound prints one of B1's bounds, a table under its title and above its
// note; with no rows — runs too short for a CPU sample (/proc/stat counts
// in ticks of 10 ms) or for a batch of the window — the title and why.
func bound(w io.Writer, title string, head []string, rows [][]string, note string) {
	fmt.Fprintf(w, "\n%s\n\n", title)
	if len(rows) == 0 {
		fmt.Fprintln(w, "not measured: the runs were too short (give more -messages)")
		return
	}
	Table(w, head, rows)
	fmt.Fprintln(w, note)
}

// medianCost is the median of each figure of costs, of those measured.
func medianCost(costs []cpuCost) cpuCost {
	var m, s, c []float64
	for _, x := range costs {
		if x.ok {
			m, s, c = append(m, x.machine), append(s, x.self), append(c, x.cores)
		}
	}
	if len(m) == 0 {
		return cpuCost{}
	}
	return cpuCost{machine: Median(m), self: Median(s), cores: Median(c), ok: true}
}

// columns is the cost as three table cells, "—" where it was not measured.
func (c cpuCost) columns() []string {
	if !c.ok {
		return []string{"—", "—", "—"}
	}
	return []string{f1(c.machine), f1(c.self), f2(c.cores)}
}

// claimedBatchOf is a batch handler's transaction for keys run+i*size …
// run+i*size+size-1: BEGIN, ClaimBatch, one INSERT, COMMIT. Its claim waits
// a millisecond for a lock, as a batch handler's does; where that wait ends
// (another transaction held a lock the INSERT needed a moment longer: the
// table's, its extension's — no key is shared), the transaction is run
// again with a claim that waits heldWait, as a batch handler claims a held
// key's delivery again alone with its ClaimTimeout.
func (v *inboxVariants) claimedBatchOf(run string, size int) Op {
	return func(ctx context.Context, i int) error {
		keys := make([]string, size)
		for j := range keys {
			keys[j] = run + strconv.Itoa(i*size+j)
		}
		err := v.claimBatch(ctx, keys, time.Millisecond) // as a batch handler claims: lock_timeout 1 ms
		if errors.Is(err, deduplication.ErrClaimInProgress) {
			err = v.claimBatch(ctx, keys, heldWait)
		}
		return err
	}
}

// heldWait is how long claimedBatchOf's second claim waits for a lock.
const heldWait = time.Minute

// claimBatch claims keys in one statement that waits at most wait for a
// lock, inserts their rows in one statement and commits.
func (v *inboxVariants) claimBatch(ctx context.Context, keys []string, wait time.Duration) error {
	tx, err := v.store.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	claimed, err := tx.(deduplication.BatchClaimer).ClaimBatch(ctx, "c", keys, wait, 0)
	if err != nil {
		return err
	}
	if _, err := sluicesql.TxOf(tx).ExecContext(ctx, v.insertBizBatch, strings.Join(claimed, ",")); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
