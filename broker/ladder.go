package broker

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicemq/sluice/internal/diag"
)

// NameMaxLength is the longest queue, topic or tier name Sluice builds or
// accepts, in bytes: AMQP's limit for queue names, routing keys and header
// names (a short string), the shortest of the brokers Sluice supports. A
// longer name is refused, never cut short.
const NameMaxLength = 255

// ErrNameTooLong is matched by every error refusing a name longer than
// NameMaxLength: a tier topic Ladder would build, a queue, an exchange or a
// header name a broker would have to send.
var ErrNameTooLong = errors.New("sluice: name longer than 255 bytes")

// delayMin is the shortest tier delay Ladder accepts (1ms).
const delayMin = time.Millisecond

// delaysDefault are the tiers' delays when none are given: 30s → 5m → 30m.
var delaysDefault = []time.Duration{30 * time.Second, 5 * time.Minute, 30 * time.Minute}

// Tier is one retry tier: a copy published to Topic comes back to the
// consumer's queue after Delay.
type Tier struct {
	Name  string
	Delay time.Duration
	Topic string
	// Waits, set by Jittered, are the queues a copy of this tier may wait
	// in instead, each with its delay: Topic (Delay) and shorter ones down
	// to Delay × (1 − Jitter.Fraction). The retry stage picks one at random.
	// Empty: Topic alone.
	Waits []Wait
}

// Topics returns every topic a copy of t may wait in: Topic, and the
// topics of its Waits.
func (t Tier) Topics() []string {
	topics := []string{t.Topic}
	for _, w := range t.Waits {
		if w.Topic != t.Topic {
			topics = append(topics, w.Topic)
		}
	}
	return topics
}

// tierName is the name of the tier of delay d: "30s", "5m", "1h30m".
func tierName(d time.Duration) string {
	return strings.NewReplacer("h0m0s", "h", "m0s", "m").Replace(d.String())
}

// TierTopic is the topic (on RabbitMQ the queue) of the retry tier of queue
// for delay d: "<queue>.retry.<name>", the name of the tier of delay d (Tier.Name:
// "30s", "5m", "1h30m"), e.g. "orders.retry.30s".
func TierTopic(queue string, d time.Duration) string { return queue + tierSuffix(d) }

// tierSuffix is what TierTopic appends to the queue's name for delay d.
func tierSuffix(d time.Duration) string { return ".retry." + tierName(d) }

// Ladder returns the tiers of the consumer queue: one per delay (default
// 30s, 5m, 30m), in order, named for its delay ("30s", "5m", "1h30m"),
// with the topic TierTopic(queue, delay). It refuses a delay under 1ms, two delays
// with one name, and a topic longer than NameMaxLength (ErrNameTooLong).
// A broker may bound the delays further (RabbitMQ's TTL).
func Ladder(queue string, delays ...time.Duration) ([]Tier, error) {
	if queue == "" {
		return nil, errors.New("sluice: a retry ladder needs the consumer's queue")
	}
	if len(delays) == 0 {
		delays = delaysDefault
	}
	tiers := make([]Tier, 0, len(delays))
	seen := map[string]bool{}
	for i, d := range delays {
		if d < delayMin {
			return nil, fmt.Errorf("sluice: tier delay %d is %s: want at least %s", i, d, delayMin)
		}
		name := tierName(d)
		if seen[name] {
			return nil, fmt.Errorf("sluice: tier delay %d is %s: two tiers with one delay", i, d)
		}
		seen[name] = true
		topic := TierTopic(queue, d)
		if len(topic) > NameMaxLength {
			return nil, fmt.Errorf("%w: tier topic %q is %d bytes, more than %d (the queue name may be at most %d bytes with this tier)",
				ErrNameTooLong, diag.Bound(topic, 64), len(topic), NameMaxLength, NameMaxLength-len(tierSuffix(d)))
		}
		tiers = append(tiers, Tier{Name: name, Delay: d, Topic: topic})
	}
	return tiers, nil
}

// CheckName returns an error matching ErrNameTooLong, naming what, when
// name is longer than NameMaxLength.
func CheckName(what, name string) error {
	if len(name) > NameMaxLength {
		return fmt.Errorf("%w: %s %q is %d bytes", ErrNameTooLong, what, diag.Bound(name, 64), len(name))
	}
	return nil
}
