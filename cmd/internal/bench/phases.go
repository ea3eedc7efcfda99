package bench

import (
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"
)

// phases records, for a diagnosis of a batch handler's window
// (SLUICE_BENCH_PHASES=1 prints it to stderr), when each delivery reached
// the router and when the stack returned it, and when each call of the
// batch handler began and ended with which deliveries. Not a figure of the
// tables: its own clock reads cost a little.
type phases struct {
	mu    sync.Mutex
	start time.Time
	at    [2]map[string]time.Duration // by stamp: each delivery's arrival, return
	calls []phaseCall
}

// The stamps phases records of each delivery.
const (
	arrival = iota // reached the router
	back           // returned by the stack
)

type phaseCall struct {
	begin, end time.Duration
	ids        []string
}

// newPhases returns a recorder, or nil unless SLUICE_BENCH_PHASES is set.
func newPhases() *phases {
	if os.Getenv("SLUICE_BENCH_PHASES") == "" {
		return nil
	}
	return &phases{start: time.Now(), at: [2]map[string]time.Duration{{}, {}}}
}

func (p *phases) arrive(id string) { p.stamp(arrival, id) }

func (p *phases) returned(id string) { p.stamp(back, id) }

// stamp records now as id's time of stamp (arrival or back).
func (p *phases) stamp(stamp int, id string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.at[stamp][id] = time.Since(p.start)
	p.mu.Unlock()
}

func (p *phases) call(begin time.Duration, ids []string) {
	if p == nil {
		return
	}
	end := time.Since(p.start)
	p.mu.Lock()
	p.calls = append(p.calls, phaseCall{begin: begin, end: end, ids: ids})
	p.mu.Unlock()
}

func (p *phases) since() time.Duration {
	if p == nil {
		return 0
	}
	return time.Since(p.start)
}

// print writes the medians over the calls: the spread of a call's
// deliveries' arrivals, from its last arrival to the call (the batch
// closing, a slot, BEGIN, the claim), the call, from the call's end to its
// first delivery returned (COMMIT, the wake-up), the spread of the returns,
// and from a call's first return to the next call's first arrival.
func (p *phases) print(w io.Writer, name string) {
	if p == nil || len(p.calls) == 0 {
		return
	}
	var spread, pre, call, commit, returns, size []float64
	type span struct{ firstArrival, firstReturn time.Duration }
	var spans []span
	for _, c := range p.calls {
		arrived, done := make([]time.Duration, len(c.ids)), make([]time.Duration, len(c.ids))
		for i, id := range c.ids {
			arrived[i], done[i] = p.at[arrival][id], p.at[back][id]
		}
		first, last, r0, r1 := slices.Min(arrived), slices.Max(arrived), slices.Min(done), slices.Max(done)
		spread = append(spread, us(last-first))
		pre = append(pre, us(c.begin-last))
		call = append(call, us(c.end-c.begin))
		commit = append(commit, us(r0-c.end))
		returns = append(returns, us(r1-r0))
		size = append(size, float64(len(c.ids)))
		spans = append(spans, span{first, r0})
	}
	slices.SortFunc(spans, func(a, b span) int { return int(a.firstArrival - b.firstArrival) })
	var refill []float64
	for i := 1; i < len(spans); i++ {
		refill = append(refill, us(spans[i].firstArrival-spans[i-1].firstReturn))
	}
	fmt.Fprintf(w, "phases %s: %d calls, mean %.1f events; medians in µs: arrivals spread %.0f, last arrival → call %.0f, call %.0f, call end → first return %.0f, returns spread %.0f, a call's first return → the next call's first arrival %.0f\n",
		name, len(p.calls), mean(size), Median(spread), Median(pre), Median(call), Median(commit), Median(returns), Median(refill))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
