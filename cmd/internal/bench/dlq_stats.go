package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/sluicemq/sluice/dlq"
)

// statsReasons is how many poison messages, each with its own 1 KiB
// reason, the dlq-stats suite aggregates: issue 18's queue.
const statsReasons = 200_000

// DLQStats prints what `sluice dlq stats --json` costs in memory over a
// poison queue of 200,000 messages whose reasons all differ (1 KiB each):
// the aggregation before — a map of every fingerprint, all of it encoded —
// against the bounded one (dlq.StatsOf, --top 20, at most Stats.Capacity,
// 1,000, values a group). Both read the same messages, generated one at a
// time as a scan of the queue hands them over, so only the aggregation
// differs; the broker is not involved. It reports each one's
// peak RSS (the process's high-water mark, reset before each variant where
// Linux allows it: /proc/self/clear_refs), the heap it retains at the end,
// what it allocated, its rows and time, and the ratios before ÷ after.
func DLQStats(_ context.Context, o Options) error {
	fmt.Fprintf(o.Out, "dlq stats --json over %d poison messages with distinct 1 KiB reasons\n\n", statsReasons)
	type result struct {
		name                string
		peakRSS, growth     int64 // bytes
		retained, allocated uint64
		rows                int
		took                time.Duration
	}
	variants := []struct {
		name string
		run  func(n int, next func(int) *dlq.Message) (dlq.Stats, []byte, error)
	}{
		{"bounded (top 20)", func(n int, next func(int) *dlq.Message) (dlq.Stats, []byte, error) {
			s := dlq.StatsOf(dlq.Filter{}, 0, func(yield func(*dlq.Message) bool) { // 0: the default top, 20
				for i := range n {
					if !yield(next(i)) {
						return
					}
				}
			})
			b, err := json.Marshal(s)
			return s, b, err
		}},
		{"unbounded (before)", func(n int, next func(int) *dlq.Message) (dlq.Stats, []byte, error) {
			s := unboundedStats(n, next)
			b, err := json.Marshal(s)
			return s, b, err
		}},
	}
	var results []result
	resets := true
	for _, v := range variants { // the bounded first: without a reset, the high-water mark only grows
		runtime.GC()
		debug.FreeOSMemory()
		if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
			resets = false
		}
		start := procStatus("VmRSS")
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		t0 := time.Now()
		s, out, err := v.run(statsReasons, reasonMessage)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		took := time.Since(t0)
		peak := procStatus("VmHWM")
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(s)
		runtime.KeepAlive(out)
		results = append(results, result{
			name: v.name, peakRSS: peak, growth: peak - start,
			retained: after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc), allocated: after.TotalAlloc - before.TotalAlloc,
			rows: len(s.ByFingerprint), took: took,
		})
		if s.Total != statsReasons {
			return fmt.Errorf("%s: counted %d messages, want %d", v.name, s.Total, statsReasons)
		}
	}
	mb := func(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }
	var rows [][]string
	for _, r := range results {
		rows = append(rows, []string{r.name, mb(r.peakRSS), mb(r.growth), mb(int64(r.retained)), mb(int64(r.allocated)),
			strconv.Itoa(r.rows), r.took.Round(10 * time.Millisecond).String()})
	}
	Table(o.Out, []string{"aggregation", "peak RSS MB", "RSS growth MB", "retained heap MB", "allocated MB", "fingerprint rows", "time"}, rows)
	b, u := results[0], results[1]
	fmt.Fprintf(o.Out, "\nbefore ÷ after: RSS growth %.1f×, retained heap %.0f×, fingerprint rows %d → %d\n",
		float64(u.growth)/float64(max(b.growth, 1)), float64(u.retained)/float64(max(b.retained, 1)), u.rows, b.rows)
	if !resets {
		fmt.Fprintln(o.Out, "(the peak RSS could not be reset between variants: the unbounded one's includes the bounded one's)")
	}
	return nil
}

// reasonMessage is poison message i: a reason of 1 KiB that no other i
// gives, even fingerprinted (its id in letters g–z: no digit, not hex).
func reasonMessage(i int) *dlq.Message {
	var b strings.Builder
	b.Grow(1024)
	b.WriteString("handler: order ")
	for n := i; n > 0 || b.Len() == len("handler: order "); n /= 20 {
		b.WriteByte(byte('g' + n%20))
	}
	b.WriteString(" cannot be priced: ")
	for b.Len() < 1024 {
		b.WriteString("the catalogue has no entry for it ")
	}
	return &dlq.Message{Class: "exhausted", Reason: b.String()[:1024], EventType: "order.created"}
}

// unboundedStats is how dlq.Queue.Stats grouped before: one map entry per
// distinct value, every one kept and encoded.
func unboundedStats(n int, next func(int) *dlq.Message) dlq.Stats {
	s := dlq.Stats{ByClass: map[string]int{}, ByFingerprint: map[string]int{}, ByEventType: map[string]int{}}
	for i := range n {
		m := next(i)
		s.Scanned++
		s.Total++
		s.ByClass[m.Class]++
		s.ByFingerprint[dlq.Fingerprint(m.Reason)]++
		s.ByEventType[m.EventType]++
	}
	return s
}

// procStatus is a size line of /proc/self/status (VmRSS, VmHWM) in bytes,
// or 0 where there is none.
func procStatus(key string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
