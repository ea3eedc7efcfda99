package main

import (
	"strings"
	"testing"
	"time"
)

// The digest is what CI keeps of a cluster scenario that did not settle:
// it must name the copies the broker holds and the missing event's last
// trace line, in a few short lines.
func TestTheDigestKeepsTheHeldCopiesAndTheMissingEventsLastTrace(t *testing.T) {
	report := strings.Join([]string{
		"node 1 reports:",
		`queue chaos_x: leader n1@localhost #{num_checked_out => 0,num_consumers => 3,num_discard_checked_out => 0,num_discarded => 0}`,
		`queue chaos_x.retry.1s: leader n3@localhost #{num_checked_out => 0,num_consumers => 0,num_discard_checked_out => 1,num_discarded => 0}`,
		`dlx worker <0.1.0> on n3@localhost for chaos_x.retry.1s: dlx client x; 1 copies awaiting a confirm (the oldest: …) ` + strings.Repeat("x", 500),
		`dlx worker <0.2.0> on n3@localhost for chaos_x.retry.2s: dlx client x; 0 copies awaiting a confirm`,
	}, "\n")
	traces := &traceLog{}
	traces.add("e000466", "process 2: 13:34:52.773 delivered (attempt 1)")
	traces.add("e000466", "process 2: 13:34:53.159 retry copy published to chaos_x.retry.1s: <nil>")
	at := time.Date(2026, 12, 7, 13, 34, 50, 0, time.UTC)
	traces.add("e000251", "process 1: 14:56:00.101 poison copy published to chaos_x.poison: <nil>")
	got := digest([]*nodeKill{{node: 1, when: at, restarted: at.Add(5 * time.Second)}}, report, []string{"e000466", "e000467"}, []string{"e000251"}, traces)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	for _, want := range []string{
		"digest: 2 valid events without an effect, 1 bad events not in the poison queue; kills: node 2 13:34:50.000–13:34:55.000",
		"digest: queue chaos_x.retry.1s: leader n3@localhost",
		"digest: dlx worker <0.1.0> on n3@localhost for chaos_x.retry.1s",
		"digest: e000466: 2 trace lines, the last: process 2: 13:34:53.159 retry copy published to chaos_x.retry.1s: <nil>",
		"digest: e000467: never delivered",
		"digest: e000251: 1 trace lines, the last: process 1: 14:56:00.101 poison copy published to chaos_x.poison: <nil>",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the digest lacks %q:\n%s", want, got)
		}
	}
	if len(lines) != 6 {
		t.Errorf("the digest has %d lines, want 6 (the queue and worker holding nothing left out):\n%s", len(lines), got)
	}
	for _, l := range lines {
		if len(l) > 240 {
			t.Errorf("a digest line is %d characters long, past what scripts/test.sh keeps (240): %.80s…", len(l), l)
		}
	}
}
