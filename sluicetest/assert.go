package sluicetest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluicemq/sluice"
)

// The assertions report a failure with t.Errorf, naming the subject and
// writing its whole trace, and return whether they held.

func (h *Harness) fail(subject, format string, args ...any) bool {
	h.t.Helper()
	h.t.Errorf("sluicetest: %q %s\n\ttrace: %s", subject, fmt.Sprintf(format, args...), h.Trace(subject))
	return false
}

// RequireOutcomes checks the subject's steps, as Trace.Outcomes writes
// them: "processed", "retried to tier 2", "poisoned (poison)", "duplicate",
// "processed, produced evt-9", "processed, crashed before the ack".
func (h *Harness) RequireOutcomes(subject string, want ...string) bool {
	h.t.Helper()
	got := h.Trace(subject).Outcomes()
	if !slices.Equal(got, want) {
		return h.fail(subject, "went through\n\t\t%s\n\twant\n\t\t%s", quoteAll(got), quoteAll(want))
	}
	return true
}

func quoteAll(s []string) string {
	if len(s) == 0 {
		return "(nothing)"
	}
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

// RequireProcessedOnce checks that the subject's handler committed exactly
// once and that its story ended there.
func (h *Harness) RequireProcessedOnce(subject string) bool {
	h.t.Helper()
	tr := h.Trace(subject)
	n := 0
	for _, s := range tr {
		if s.Outcome == sluice.OutcomeProcessed {
			n++
		}
	}
	switch {
	case len(tr) == 0:
		return h.fail(subject, "was never delivered to the handler")
	case n != 1:
		return h.fail(subject, "was processed %d times, want once", n)
	case !tr.Last().final():
		return h.fail(subject, "has not ended: its last step is %q", tr.Last())
	}
	return true
}

// RequireDuplicate checks that the subject's last delivery was recognised
// by the inbox as a duplicate: acked without running the handler.
func (h *Harness) RequireDuplicate(subject string) bool {
	h.t.Helper()
	last := h.Trace(subject).Last()
	switch {
	case last.Outcome != sluice.OutcomeDuplicate:
		return h.fail(subject, "ended %q, want duplicate", last)
	case last.Ran:
		return h.fail(subject, "was a duplicate, but the handler ran")
	}
	return true
}

// RequireRejected checks that the subject ended rejected: a business
// rejection committed with its claim and acked.
func (h *Harness) RequireRejected(subject string) bool {
	h.t.Helper()
	if last := h.Trace(subject).Last(); last.Outcome != sluice.OutcomeRejected {
		return h.fail(subject, "ended %q, want rejected", last)
	}
	return true
}

// RequireParked checks that a copy of the subject waited in retry tier
// tier (1 for the first).
func (h *Harness) RequireParked(subject string, tier int) bool {
	h.t.Helper()
	for _, s := range h.Trace(subject) {
		if s.Outcome == sluice.OutcomeRetried && s.Tier == tier {
			return true
		}
	}
	return h.fail(subject, "never went to retry tier %d", tier)
}

// RequirePoisoned checks that the subject ended in the poison queue with
// class and with each of diagnosis's headers (sluice_poison_reason, say)
// as given; an empty value only requires the header.
func (h *Harness) RequirePoisoned(subject string, class sluice.Class, diagnosis map[string]string) bool {
	h.t.Helper()
	last := h.Trace(subject).Last()
	switch {
	case last.Outcome != sluice.OutcomePoisoned:
		return h.fail(subject, "ended %q, want poisoned (%s)", last, class)
	case last.Class != class:
		return h.fail(subject, "was poisoned with class %s, want %s", last.Class, class)
	}
	for k, want := range diagnosis {
		got, ok := last.Diagnosis[k]
		switch {
		case !ok:
			return h.fail(subject, "was poisoned without the diagnosis header %s; it has %s", k, diagnosisString(last.Diagnosis))
		case want != "" && got != want:
			return h.fail(subject, "was poisoned with %s=%q, want %q", k, got, want)
		}
	}
	return true
}

// RequireHeld checks that the brake gave one of the subject's deliveries
// back unprocessed: no attempt, no tier spent.
func (h *Harness) RequireHeld(subject string) bool {
	h.t.Helper()
	for _, s := range h.Trace(subject) {
		if s.Outcome == sluice.OutcomeHeld {
			return true
		}
	}
	return h.fail(subject, "was never held by the brake")
}

// RequireProduced checks that the subject's committed delivery produced
// exactly the messages with these event ids (outbox rows), and that the
// relay published each.
func (h *Harness) RequireProduced(subject string, eventIDs ...string) bool {
	h.t.Helper()
	var got []string
	for _, s := range h.Trace(subject) {
		got = append(got, s.Produced...)
	}
	if !slices.Equal(got, eventIDs) {
		return h.fail(subject, "produced %s, want %s", quoteAll(got), quoteAll(eventIDs))
	}
	relayed := map[string]int{}
	for _, m := range h.Relayed() {
		relayed[m.Metadata.Get(sluice.EventIDKey)]++
	}
	for _, id := range eventIDs {
		if relayed[id] != 1 {
			return h.fail(subject, "produced %q, which the relay published %d times, want once", id, relayed[id])
		}
	}
	return true
}
