package main

import (
	"slices"
	"testing"
	"time"
)

// An event is the broker's loss only when its trace ends with a copy the
// broker confirmed into a queue only the broker drains, held then by a
// node killed and not yet back: a confirmed poison copy (a bad event's) or
// retry copy with no delivery from its publish on. A failed publish, a
// later delivery, a copy sent elsewhere or after the node was back, a
// valid event's poison copy, no trace or a cut one leave it Sluice's.
func TestOnlyACopyTheBrokerConfirmedAndNeverGaveBackIsTheBrokersLoss(t *testing.T) {
	day := time.Date(2026, 12, 7, 9, 59, 0, 0, time.UTC)
	at := func(clock string) time.Time {
		c, err := time.Parse(traceClock, clock)
		if err != nil {
			t.Fatal(err)
		}
		return time.Date(2026, 12, 7, c.Hour(), c.Minute(), c.Second(), c.Nanosecond(), time.UTC)
	}
	tiers := []string{"q.retry.1s", "q.retry.5s"}
	valid, bad := tiers, append(slices.Clip(tiers), "q.poison") // a valid event's poison copy is never the broker's loss
	r := lossRule{start: day, kills: []*nodeKill{
		{queues: []string{"q"}, online: at("10:00:00.500")},
		{queues: []string{"q.retry.1s", "q.retry.5s", "q.poison"}, online: at("10:00:05.000")},
	}}
	traces := &traceLog{}
	add := func(id string, lines ...string) {
		for _, l := range lines {
			traces.add(id, l)
		}
	}
	add("poisoned", "process 1: 10:00:00.100 delivered (attempt 1)", "process 1: 10:00:00.200 poison copy published to q.poison (sent 10:00:00.150): <nil>")
	add("tier", "process 2: 10:00:01.000 delivered (attempt 1)", "process 2: 10:00:01.100 retry copy published to q.retry.1s (sent 10:00:01.050): <nil>")
	add("second-tier", // back from the first tier, then lost in the second
		"process 1: 10:00:01.000 delivered (attempt 1)", "process 1: 10:00:01.100 retry copy published to q.retry.1s (sent 10:00:01.050): <nil>",
		"process 2: 10:00:02.200 delivered (attempt 2)", "process 2: 10:00:02.300 retry copy published to q.retry.5s (sent 10:00:02.250): <nil>")
	add("other-process-first", // lines of two processes, read out of order
		"process 2: 10:00:02.300 retry copy published to q.retry.5s (sent 10:00:02.250): <nil>", "process 1: 10:00:01.000 delivered (attempt 1)")
	add("refused", "process 1: 10:00:00.100 delivered (attempt 1)", "process 1: 10:00:00.200 poison copy published to q.poison (sent 10:00:00.150): publish not confirmed")
	add("came-back", "process 1: 10:00:01.100 retry copy published to q.retry.1s (sent 10:00:01.050): <nil>", "process 3: 10:00:02.200 delivered (attempt 2)")
	add("stalled-trace", // the publisher's line written after the copy's delivery: the publish's start counts
		"process 3: 10:00:01.060 delivered (attempt 2)", "process 1: 10:00:02.100 retry copy published to q.retry.1s (sent 10:00:01.050): <nil>")
	add("elsewhere", "process 1: 10:00:01.100 retry copy published to q (sent 10:00:01.050): <nil>")
	add("after-the-node-was-back", "process 1: 10:00:06.100 retry copy published to q.retry.1s (sent 10:00:06.050): <nil>")
	add("no-publish", "process 1: 10:00:01.000 delivered (attempt 1)", "process 1: 10:00:01.050 handled: <nil> (nil: acked next)")
	traces.add("cut", "process 1: 10:00:00.100 poison copy published to q.poison (sent 10:00:00.050): <nil>")
	for range traceLinesPerEvent - 1 { // its later lines, a delivery among them perhaps, not kept
		traces.add("cut", "process 1: 10:00:00.200 effect written, not committed")
	}
	add("valid-poisoned", "process 1: 10:00:00.200 poison copy published to q.poison (sent 10:00:00.150): <nil>")

	badIDs := []string{"poisoned", "refused", "cut", "untraced"}
	if got, want := r.dropped(badIDs, bad, traces.of), []string{"poisoned"}; !slices.Equal(got, want) {
		t.Errorf("bad events dropped by the broker: %v, want %v", got, want)
	}
	validIDs := []string{"tier", "second-tier", "other-process-first", "came-back", "stalled-trace", "elsewhere", "after-the-node-was-back", "no-publish", "valid-poisoned"}
	if got, want := r.dropped(validIDs, valid, traces.of), []string{"tier", "second-tier", "other-process-first"}; !slices.Equal(got, want) {
		t.Errorf("valid events dropped by the broker: %v, want %v", got, want)
	}
}

// A run that passes midnight reads its traces' times of day on the next
// day: a delivery at 00:00:01 came after a copy sent at 23:59:59.
func TestTracesPastMidnightAreReadOnTheNextDay(t *testing.T) {
	start := time.Date(2026, 12, 7, 23, 58, 0, 0, time.UTC)
	r := lossRule{start: start, kills: []*nodeKill{{queues: []string{"q.retry.1s"}, online: start.Add(5 * time.Minute)}}}
	traces := &traceLog{}
	traces.add("came-back", "process 1: 23:59:59.950 retry copy published to q.retry.1s (sent 23:59:59.900): <nil>")
	traces.add("came-back", "process 2: 00:00:01.000 delivered (attempt 2)")
	traces.add("lost", "process 1: 00:00:00.550 retry copy published to q.retry.1s (sent 00:00:00.500): <nil>")
	if got, want := r.dropped([]string{"came-back", "lost"}, []string{"q.retry.1s"}, traces.of), []string{"lost"}; !slices.Equal(got, want) {
		t.Errorf("dropped by the broker: %v, want %v", got, want)
	}
	for _, c := range []struct {
		clock string
		want  time.Time
	}{{"23:58:30.000", start.Add(30 * time.Second)}, {"00:00:00.500", start.Add(2*time.Minute + 500*time.Millisecond)}} {
		if got, ok := r.clock(c.clock); !ok || !got.Equal(c.want) {
			t.Errorf("clock(%s) = %v, %v; want %v", c.clock, got, ok, c.want)
		}
	}
	if _, ok := r.clock("25:00"); ok {
		t.Error("a line without a time of day read as one")
	}
}
