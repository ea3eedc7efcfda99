package retrytiers

import (
	"math/rand/v2"
	"time"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/broker"
)

// plan is where the copy of a failed attempt goes.
type plan struct {
	tier  int           // index in Config.Tiers
	topic string        // the wait of that tier the copy is published to
	wait  time.Duration // its delay
	next  int           // the copy's attempt
	after time.Duration // the wait the failure asked for (sluice.RetryAfter)
	asked bool          // whether it asked
}

// plan returns where the copy of the delivery whose attempt failed with
// err goes: the next tier of the ladder, at one of its waits chosen at
// random; or, for a failure that asks to wait (sluice.RetryAfterOf), the
// nearest tier that waits at least that long — the one with the shortest
// Delay of those whose Delay is at least the wait, else the longest — at a
// wait of it that is long enough (at random among them). The copy's attempt
// counts the tiers skipped: it is the one that follows the chosen tier, or
// the next after this one when the chosen tier is an earlier one.
func (s *stage) plan(attempt int, err error) plan {
	after, asked := sluice.RetryAfterOf(err)
	if !asked {
		w := s.cfg.Tiers[attempt-1].Pick()
		return plan{tier: attempt - 1, topic: w.Topic, wait: w.Delay, next: attempt + 1}
	}
	tiers := s.cfg.Tiers
	chosen, longest := -1, 0
	for i, t := range tiers {
		if t.Delay > tiers[longest].Delay {
			longest = i
		}
		if t.Delay >= after && (chosen < 0 || t.Delay < tiers[chosen].Delay) {
			chosen = i
		}
	}
	if chosen < 0 {
		chosen = longest
	}
	w := waitAtLeast(tiers[chosen], after)
	return plan{tier: chosen, topic: w.Topic, wait: w.Delay, next: max(attempt, chosen+1) + 1, after: after, asked: true}
}

// waitAtLeast returns one of t's waits at least d long, at random, or its
// longest when none is.
func waitAtLeast(t broker.Tier, d time.Duration) broker.Wait {
	var long []broker.Wait
	for _, w := range t.Waits {
		if w.Delay >= d {
			long = append(long, w)
		}
	}
	if len(long) == 0 {
		return broker.Wait{Delay: t.Delay, Topic: t.Topic}
	}
	return long[rand.IntN(len(long))] //nolint:gosec // a spread, not a secret
}
