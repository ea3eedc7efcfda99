package broker

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicemq/sluice/internal/diag"
)

// Jitter's defaults and bounds, as Jitter's fields document them.
const (
	// jitterQueuesDefault is Jitter.Queues' default.
	jitterQueuesDefault = 4
	// jitterQueuesMax bounds Jitter.Queues: each is a queue of its own.
	jitterQueuesMax = 16
	// jitterFractionMax bounds Jitter.Fraction: a copy waits at least half
	// its tier's delay.
	jitterFractionMax = 0.5
)

// Jitter spreads the copies of each tier over several waits, so that the
// messages an outage sent to a tier together do not all come back at once.
//
// A tier waits in queues with a TTL of their own (on RabbitMQ, a queue
// with x-message-ttl), and such a queue expires messages at its head only:
// a per-message expiration shorter than the one ahead of it waits for the
// head to expire, so jitter by message within one queue gives a burst of
// copies one return time, the latest. Jitter therefore gives each tier
// Queues waits, evenly spread over [Delay × (1 − Fraction), Delay], each a
// queue of its own with one TTL, and the retry stage sends each copy to
// one of them at random: the copies of a burst come back in Queues waves
// over Fraction × Delay. A copy never waits longer than its tier's Delay,
// so the ladder's total (and the retention it asks of the inbox) is
// unchanged.
type Jitter struct {
	// Fraction of each tier's delay by which a copy may come back earlier:
	// 0 (the default) no jitter; at most 0.5: a copy waits at least half
	// its tier's delay.
	Fraction float64
	// Queues is the number of waits per tier, the tier's own queue among
	// them, each a queue of its own. Default 4; 2 to 16.
	Queues int
}

// Jittered returns tiers (of Ladder(queue, …)) with their Waits: for each
// tier, Jitter.Queues delays evenly spread from its Delay down to Delay ×
// (1 − Fraction) (whole milliseconds, at least 1ms), each with the
// topic TierTopic(queue, delay). The tier keeps its Name, Delay and Topic
// (the longest wait). A zero Fraction returns tiers unchanged. It refuses a
// Fraction or Queues out of bounds, two waits with one topic across the
// ladder, and a topic longer than NameMaxLength (ErrNameTooLong).
func Jittered(queue string, tiers []Tier, j Jitter) ([]Tier, error) {
	if j.Fraction == 0 {
		return tiers, nil
	}
	if !(j.Fraction > 0 && j.Fraction <= jitterFractionMax) {
		return nil, fmt.Errorf("sluice: Jitter.Fraction is %g: want 0 (none) or more, up to %g", j.Fraction, jitterFractionMax)
	}
	if j.Queues == 0 {
		j.Queues = jitterQueuesDefault
	}
	if j.Queues < 2 || j.Queues > jitterQueuesMax {
		return nil, fmt.Errorf("sluice: Jitter.Queues is %d: want 2 to %d", j.Queues, jitterQueuesMax)
	}
	out := make([]Tier, len(tiers))
	seen := map[string]string{}
	for i, t := range tiers {
		t.Waits = make([]Wait, 0, j.Queues)
		for k := range j.Queues {
			cut := time.Duration(float64(t.Delay) * j.Fraction * float64(k) / float64(j.Queues-1))
			d := max((t.Delay - cut).Truncate(time.Millisecond), delayMin)
			topic := t.Topic
			if k > 0 {
				topic = TierTopic(queue, d)
			}
			if other, dup := seen[topic]; dup {
				return nil, fmt.Errorf("sluice: jitter gives tiers %s and %s one wait, %q: use fewer Jitter.Queues or other delays", other, t.Name, diag.Bound(topic, 64))
			}
			seen[topic] = t.Name
			if err := CheckName("jittered tier topic", topic); err != nil {
				return nil, err
			}
			t.Waits = append(t.Waits, Wait{Delay: d, Topic: topic})
		}
		out[i] = t
	}
	return out, nil
}

// Wait is one of a jittered tier's queues: a copy published to Topic comes
// back to the consumer's queue after Delay.
type Wait struct {
	Delay time.Duration
	Topic string
}

// Pick returns where a copy of t waits: one of its Waits at random, or, for
// a tier without, Topic and Delay. Safe for concurrent use.
func (t Tier) Pick() Wait {
	if len(t.Waits) == 0 {
		return Wait{Delay: t.Delay, Topic: t.Topic}
	}
	return t.Waits[rand.IntN(len(t.Waits))] //nolint:gosec // a spread, not a secret
}
