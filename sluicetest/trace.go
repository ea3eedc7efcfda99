package sluicetest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluicemq/sluice"
)

// Step is what became of one delivery of a published message: the fate the
// stages recorded (the same sluice.Report the Trace stage reads), with what
// the kit saw around it.
type Step struct {
	// Outcome is the delivery's fate: processed, duplicate, rejected,
	// retried (a copy waits in a tier), parked (the poison queue refused its
	// copy), poisoned, held (the brake gave it back), requeued (a shutdown
	// gave it back) or failed (an error reached the router: nacked).
	Outcome sluice.Outcome
	// Class is the failure's class, when there was one.
	Class sluice.Class
	// Tier is the retry tier a copy went to, 1 for the first; TierName its
	// name ("30s"). Zero without a copy in a tier.
	Tier     int
	TierName string
	// Attempt is the delivery's attempt number (1 for the first), as the
	// retry stage reads it.
	Attempt int
	// Ran says the handler ran (a duplicate, a held delivery and a parked
	// copy back on its way to the poison queue do not run it).
	Ran bool
	// Reason is the bounded error summary of a poisoned delivery.
	Reason string
	// Diagnosis holds the poison copy's diagnosis headers (sluice_poison_*).
	Diagnosis map[string]string
	// Produced are the event ids (sluice_event_id, else the UUID) of the
	// messages a PublishingHandler returned in a committed delivery: rows
	// of the outbox, written in the inbox's transaction.
	Produced []string
	// Crashed says the kit dropped the ack of this committed delivery
	// (Harness.CrashAfterCommit): the broker delivers it again.
	Crashed bool
	// At is the virtual time since the harness started when the delivery
	// ended.
	At time.Duration
}

// String is the step as the kit's failure messages and Trace.Outcomes
// write it, without the times: "retried to tier 1", "poisoned (poison)".
func (s Step) String() string {
	var b strings.Builder
	b.WriteString(string(s.Outcome))
	switch {
	case s.Tier > 0:
		fmt.Fprintf(&b, " to tier %d", s.Tier)
	case s.Outcome == sluice.OutcomeFailed || s.Outcome == sluice.OutcomePoisoned:
		if s.Class.Valid() {
			fmt.Fprintf(&b, " (%s)", s.Class)
		}
	}
	if len(s.Produced) > 0 {
		fmt.Fprintf(&b, ", produced %s", strings.Join(s.Produced, " "))
	}
	if s.Crashed {
		b.WriteString(", crashed before the ack")
	}
	return b.String()
}

// Trace is the steps of one published message and of its copies (tiers,
// redeliveries), in order.
type Trace []Step

// Outcomes returns each step's String: what a table test compares, the same
// on the kit and on a real broker with a shortened ladder.
func (t Trace) Outcomes() []string {
	out := make([]string, len(t))
	for i, s := range t {
		out[i] = s.String()
	}
	return out
}

// Last returns the last step, or the zero Step.
func (t Trace) Last() Step {
	if len(t) == 0 {
		return Step{}
	}
	return t[len(t)-1]
}

// String writes the trace on one line, with the virtual times.
func (t Trace) String() string {
	if len(t) == 0 {
		return "(no delivery seen)"
	}
	parts := make([]string, len(t))
	for i, s := range t {
		parts[i] = fmt.Sprintf("%s @%s", s, s.At)
	}
	return strings.Join(parts, " → ")
}

// final reports whether the step ends the message's story: nothing of it
// waits in a tier or goes back to the queue.
func (s Step) final() bool {
	switch s.Outcome {
	case sluice.OutcomeProcessed, sluice.OutcomeDuplicate, sluice.OutcomeRejected, sluice.OutcomePoisoned:
		return !s.Crashed
	}
	return false
}

func diagnosisString(d map[string]string) string {
	keys := slices.Sorted(maps.Keys(d))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, d[k])
	}
	return strings.Join(parts, " ")
}
