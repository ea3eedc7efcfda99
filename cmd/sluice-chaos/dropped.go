package main

import (
	"regexp"
	"slices"
	"strings"
	"time"
)

// A copy the broker confirmed is the broker's to keep: Sluice's part of an
// event ends there. In cluster-node-kill, RabbitMQ 3.10.8 has lost such
// copies after a queue's leader was SIGKILLed and restarted (docs/
// reliability.md, "The broker's losses"): the scenario's check then failed
// on the broker, not on Sluice. dropped tells those events apart, from the
// consumers' traces, so that the check holds Sluice to everything else
// and reports the broker's losses on their own.

// droppedStable is how long settle waits, with every event accounted for
// but some dropped, before it takes the run as settled: a copy on its way
// back from a tier by at-least-once dead-lettering is in no queue's ready
// count; the nodes' dead-letter workers send an unconfirmed copy again
// after 10 s (testenv.ClusterOptions.DeadLetterConfirmTimeout).
const droppedStable = 30 * time.Second

// traceLine is a consumer's trace line as the harness keeps it: "process N:
// HH:MM:SS.mmm what".
var traceLine = regexp.MustCompile(`^process \d+: (\d\d:\d\d:\d\d\.\d\d\d) (.*)$`)

// droppedBy returns, of the events ids (missing at the end: valid ones
// without an effect, bad ones not in the poison queue), those the broker
// dropped: an event whose consumers' trace has a copy published, and
// confirmed (the publisher's answer nil), to one of the queues held — the
// poison queue, which nothing drains here but the harness's reads (each
// puts back what it took), and the retry tiers, whose copies come back to
// the main queue only by the broker's dead-lettering — and no delivery of
// it at or after that moment. An event whose trace was cut
// (traceLinesPerEvent) is never counted dropped: its last lines are not
// known. The ids keep their order.
func droppedBy(ids []string, held []string, trace func(id string) []string) []string {
	var dropped []string
	for _, id := range ids {
		lines := trace(id)
		if len(lines) == 0 || len(lines) >= traceLinesPerEvent {
			continue
		}
		var confirmed, delivered string // the latest moments, "HH:MM:SS.mmm" (same day: a run is minutes)
		for _, l := range lines {
			m := traceLine.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			at, what := m[1], m[2]
			switch {
			case strings.HasPrefix(what, "delivered "):
				delivered = max(delivered, at)
			case strings.HasSuffix(what, ": <nil>") && strings.Contains(what, " published to "):
				_, rest, _ := strings.Cut(what, " published to ")
				if slices.Contains(held, strings.TrimSuffix(rest, ": <nil>")) {
					confirmed = max(confirmed, at)
				}
			}
		}
		if confirmed != "" && delivered < confirmed {
			dropped = append(dropped, id)
		}
	}
	return dropped
}

// dropped is droppedBy on the world's queues and traces: the poison queue
// and the retry tiers. Only cluster-node-kill asks (nil elsewhere).
func (w *world) dropped(ids []string) []string {
	if w.cl == nil || len(ids) == 0 {
		return nil
	}
	held := []string{w.topo.Config().PoisonQueue}
	for _, t := range w.topo.Tiers() {
		held = append(held, t.Topic)
	}
	return droppedBy(ids, held, w.traces.of)
}
