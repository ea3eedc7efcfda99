package main

import (
	"fmt"
	"slices"
	"testing"
)

// An event is the broker's loss only when its trace ends with a copy the
// broker confirmed into a queue only the broker drains: a confirmed poison
// copy or retry copy with no delivery after it. A failed publish, a later
// delivery, a copy sent elsewhere, no trace or a cut one leave it Sluice's.
func TestOnlyACopyTheBrokerConfirmedAndNeverGaveBackIsTheBrokersLoss(t *testing.T) {
	held := []string{"q.poison", "q.retry.1s", "q.retry.5s"}
	traces := &traceLog{}
	add := func(id string, lines ...string) {
		for _, l := range lines {
			traces.add(id, l)
		}
	}
	add("poisoned", "process 1: 10:00:00.100 delivered (attempt 1)", "process 1: 10:00:00.200 poison copy published to q.poison: <nil>")
	add("tier", "process 2: 10:00:01.000 delivered (attempt 1)", "process 2: 10:00:01.100 retry copy published to q.retry.1s: <nil>")
	add("second-tier", // back from the first tier, then lost in the second
		"process 1: 10:00:01.000 delivered (attempt 1)", "process 1: 10:00:01.100 retry copy published to q.retry.1s: <nil>",
		"process 2: 10:00:02.200 delivered (attempt 2)", "process 2: 10:00:02.300 retry copy published to q.retry.5s: <nil>")
	add("other-process-first", // lines of two processes, read out of order
		"process 2: 10:00:02.300 retry copy published to q.retry.5s: <nil>", "process 1: 10:00:01.000 delivered (attempt 1)")
	add("refused", "process 1: 10:00:00.100 delivered (attempt 1)", "process 1: 10:00:00.200 poison copy published to q.poison: publish not confirmed")
	add("came-back", "process 1: 10:00:01.100 retry copy published to q.retry.1s: <nil>", "process 3: 10:00:02.200 delivered (attempt 2)")
	add("same-moment", "process 1: 10:00:01.100 retry copy published to q.retry.1s: <nil>", "process 3: 10:00:01.100 delivered (attempt 2)")
	add("elsewhere", "process 1: 10:00:01.100 retry copy published to q: <nil>")
	add("no-publish", "process 1: 10:00:01.000 delivered (attempt 1)", "process 1: 10:00:01.050 handled: <nil> (nil: acked next)")
	for i := range traceLinesPerEvent {
		traces.add("cut", fmt.Sprintf("process 1: 10:00:%02d.000 delivered (attempt %d)", i, i+1))
	}
	traces.add("cut", "process 1: 10:00:59.000 retry copy published to q.retry.1s: <nil>") // beyond the bound: not kept

	ids := []string{"poisoned", "tier", "second-tier", "other-process-first", "refused", "came-back", "same-moment", "elsewhere", "no-publish", "cut", "untraced"}
	got := droppedBy(ids, held, traces.of)
	want := []string{"poisoned", "tier", "second-tier", "other-process-first"}
	if !slices.Equal(got, want) {
		t.Errorf("dropped by the broker: %v, want %v", got, want)
	}
}
