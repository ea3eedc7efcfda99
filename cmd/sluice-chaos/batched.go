package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// batchedSuffix turns group commit on for a scenario's consumers: kill-batched
// is the kill scenario with deduplication.Config.Batch set on every inbox.
const batchedSuffix = "-batched"

// batchHandlerSuffix runs a scenario's consumers with a batch handler
// (router.HandlerConfig.BatchHandler): kill-batch-handler is the kill
// scenario with every event written by a batch handler.
const batchHandlerSuffix = "-batch-handler"

// batchHandlerArgs gives the world's consumers a batch handler, with the
// mid-batch self-crash among their crash points.
func (w *world) batchHandlerArgs() {
	w.slotArgs = append(w.slotArgs, "--batch-handler", fmt.Sprint(w.o.batchHandlerSize), "--max-wait", w.o.maxWait.String(),
		"--prefetch", fmt.Sprint(2*w.o.batchHandlerSize), "--crash-points", strings.Join(append(killCrashPoints[:len(killCrashPoints):len(killCrashPoints)], midBatchPoint), ","))
}

// midBatchPoint is the batched scenarios' extra self-crash: in the handler,
// its row written, while other deliveries' handlers have returned and wait
// for their batch's commit — the moment a crash takes most uncommitted work
// with it.
const midBatchPoint = "mid-batch"

// batchSizes is the consumers' MeterProvider in the batched scenarios: it
// writes each record of the inbox's batch-size histogram
// ("sluice.inbox.batch.size", one a commit) to stderr as "count
// batch-size-K 1", and drops every other instrument. One line a commit, in
// one write, when it is recorded: a process SIGKILLed a moment later still
// reported it, which a periodic reader would not have.
type batchSizes struct{ noop.MeterProvider }

func (batchSizes) Meter(string, ...metric.MeterOption) metric.Meter { return batchMeter{} }

type batchMeter struct{ noop.Meter }

func (batchMeter) Int64Histogram(name string, _ ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	if name != "sluice.inbox.batch.size" {
		return noop.Int64Histogram{}, nil
	}
	return batchHistogram{}, nil
}

type batchHistogram struct{ noop.Int64Histogram }

func (batchHistogram) Record(_ context.Context, n int64, _ ...metric.RecordOption) {
	_, _ = fmt.Fprintf(os.Stderr, "count batch-size-%d 1\n", n)
}

// describeBatches summarises the consumers' batch reports: commits,
// deliveries per commit and how often each size occurred.
func describeBatches(counts map[string]int) string {
	type size struct{ k, n int }
	var sizes []size
	commits, deliveries := 0, 0
	for name, n := range counts {
		if k, err := strconv.Atoi(strings.TrimPrefix(name, "batch-size-")); err == nil && strings.HasPrefix(name, "batch-size-") {
			sizes = append(sizes, size{k, n})
			commits, deliveries = commits+n, deliveries+k*n
		}
	}
	if commits == 0 {
		return "batches: none reported"
	}
	sort.Slice(sizes, func(i, j int) bool { return sizes[i].k < sizes[j].k })
	parts := make([]string, 0, len(sizes))
	for _, s := range sizes {
		parts = append(parts, fmt.Sprintf("%d:%d", s.k, s.n))
	}
	return fmt.Sprintf("batches: %d deliveries in %d commits (%.1f a commit; by size %s)",
		deliveries, commits, float64(deliveries)/float64(commits), strings.Join(parts, " "))
}

// awaiting tracks the deliveries whose handler returned successfully and
// whose router handler (the whole stack, the inbox's commit included) has
// not returned yet: in a batch, those waiting for its commit.
type awaiting struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

// handled marks uuid's handler done; it returns how many others wait.
func (a *awaiting) handled(uuid string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.ids)
	a.ids[uuid] = struct{}{}
	return n
}

// returned marks uuid's router handler returned.
func (a *awaiting) returned(uuid string) {
	a.mu.Lock()
	delete(a.ids, uuid)
	a.mu.Unlock()
}

// batchArgs turns group commit on for the world's consumers, with the
// mid-batch self-crash among their crash points.
func (w *world) batchArgs() {
	points := killCrashPoints
	if w.ob != nil {
		points = outboxCrashPoints
	}
	w.slotArgs = append(w.slotArgs, "--max-batch", fmt.Sprint(w.o.maxBatch), "--max-wait", w.o.maxWait.String(),
		"--prefetch", fmt.Sprint(w.o.batchPrefetch), "--crash-points", strings.Join(append(points[:len(points):len(points)], midBatchPoint), ","))
}
