package dlq

import (
	"cmp"
	"context"
	"hash/maphash"
	"iter"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluicemq/sluice"
	"github.com/sluicemq/sluice/internal/diag"
)

// Stats' bounds: whatever a poison queue holds — 200,000 messages with as
// many different reasons — stats keeps a bounded number of values.
const (
	// topDefault is how many values of each group (class, error
	// fingerprint, event type) Stats shows when asked for 0; the messages
	// of the others are counted in Other.
	topDefault = 20
	// topMax is the most values of a group Stats shows: more is taken as
	// topMax.
	topMax = 1000
	// valueMaxLength bounds, in bytes, a fingerprint, class or event type
	// as it is counted (the reason is cut before it is fingerprinted).
	valueMaxLength = 1024
)

// capacity is how many distinct values of each group Stats tracks
// to show top of them: 50 × top, at least 1000 (Stats.Capacity).
func capacity(top int) int { return max(1000, 50*top) }

// Stats is what stats reports about a poison queue.
type Stats struct {
	Total   int `json:"total"`   // messages the filter selects
	Scanned int `json:"scanned"` // messages read
	Skipped int `json:"skipped"` // read and not selected by the filter
	// Items is how many distinct copies the Total messages are: two
	// entries with one copy identity (sluice.CopyIDKey, else the message
	// UUID) — one delivery's copy made twice after an uncertain publish —
	// count once. Exact up to 2^20 (1,048,576) identities; beyond, each new
	// one is counted without being kept, and ItemsApproximate says Items is
	// an upper bound.
	Items            int  `json:"items"`
	ItemsApproximate bool `json:"items_approximate,omitempty"`
	// ByClass, ByFingerprint and ByEventType are each group's Top most
	// frequent values with their counts.
	ByClass       map[string]int `json:"by_class"`
	ByFingerprint map[string]int `json:"by_fingerprint"`
	ByEventType   map[string]int `json:"by_event_type"`
	// Other is, per group, how many of the Total messages are not counted
	// under a value shown.
	Other struct {
		Class       int `json:"class"`
		Fingerprint int `json:"fingerprint"`
		EventType   int `json:"event_type"`
	} `json:"other"`
	// Top is how many values of each group are shown at most: the top
	// Stats was given, 20 for 0, at most 1000.
	Top int `json:"top"`
	// Capacity is how many distinct values of each group were tracked to
	// find the Top: 50 × Top, at least 1000. While a group has no more
	// distinct values than that, its counts are exact.
	Capacity int `json:"capacity"`
	// Approximate names the groups that had more distinct values than
	// Capacity: their counts are then lower bounds (each short by at most
	// Total ÷ (Capacity+1), counted in Other instead), and a value more
	// frequent than that is never missed.
	Approximate []string  `json:"approximate,omitempty"`
	Oldest      time.Time `json:"oldest_poisoned_at"`
	Newest      time.Time `json:"newest_poisoned_at"`
	// Unreadable counts the selected messages whose headers the AMQP client
	// could not parse, and UnreadableFirst names the first 20 of them —
	// they have no readable diagnosis or event id — by their place in the
	// queue, their message id (a property, readable), their size, and why
	// (bounded).
	Unreadable      int `json:"unreadable"`
	UnreadableFirst []struct {
		Position  int    `json:"position"`
		MessageID string `json:"message_id,omitempty"`
		BodyBytes int    `json:"body_bytes"`
		Reason    string `json:"reason"`
	} `json:"unreadable_first,omitempty"`
}

// itemsTrackedMax bounds the copy identities Stats keeps to count Items:
// a 64-bit hash each, some 20 MiB at the most.
const itemsTrackedMax = 1 << 20

// unreadableMax is how many unreadable messages Stats names.
const unreadableMax = 20

// readStats is Queue.Stats on conn's queue.
func readStats(ctx context.Context, conn *amqp.Connection, queue string, f Filter, top int) (Stats, error) {
	c := newStatsCounter(f, top)
	_, err := scanQueue(ctx, conn, queue, func(m *Message) (bool, error) {
		c.Add(m)
		return false, nil
	}, nil)
	return c.Stats(), err
}

// StatsOf groups the messages of msgs as Queue.Stats groups a queue's, in
// the same bounded memory: messages read from elsewhere (Queue.Each,
// another broker's dead letters) or made up, one at a time.
func StatsOf(f Filter, top int, msgs iter.Seq[*Message]) Stats {
	c := newStatsCounter(f, top)
	for m := range msgs {
		c.Add(m)
	}
	return c.Stats()
}

// statsCounter groups messages as they are read, in bounded memory: each
// group keeps at most capacity(top) counters (the Misra–Gries summary: a
// new value when all are taken lowers every counter by one and drops those
// at zero), so that a queue of many distinct reasons costs no more than one
// of few. Not safe for concurrent use.
type statsCounter struct {
	f                    Filter
	s                    Stats
	class, fp, eventType *counters
	items                map[uint64]struct{} // hashes of the copy identities counted
	seed                 maphash.Seed
}

// newStatsCounter counts the messages f selects; top as in Queue.Stats.
func newStatsCounter(f Filter, top int) *statsCounter {
	if top <= 0 {
		top = topDefault
	}
	top = min(top, topMax)
	n := capacity(top)
	return &statsCounter{f: f, s: Stats{Top: top, Capacity: n}, class: newCounters(n), fp: newCounters(n), eventType: newCounters(n),
		items: make(map[uint64]struct{}), seed: maphash.MakeSeed()}
}

// Add counts m: read, and when the filter selects it, under its class,
// fingerprint and event type.
func (c *statsCounter) Add(m *Message) {
	c.s.Scanned++
	if !c.f.Match(m) {
		c.s.Skipped++
		return
	}
	c.s.Total++
	c.countItem(cmp.Or(m.Msg.Metadata.Get(sluice.CopyIDKey), m.Msg.UUID))
	c.class.add(orNone(diag.Bound(m.Class, valueMaxLength)))
	c.fp.add(orNone(diag.Bound(Fingerprint(diag.Bound(m.Reason, valueMaxLength)), valueMaxLength)))
	c.eventType.add(orNone(diag.Bound(m.EventType, valueMaxLength)))
	if m.HeadersError != "" {
		c.s.Unreadable++
		if n := len(c.s.UnreadableFirst); n < unreadableMax {
			c.s.UnreadableFirst = slices.Grow(c.s.UnreadableFirst, 1)[:n+1]
			u := &c.s.UnreadableFirst[n]
			u.Position, u.MessageID, u.BodyBytes = m.Position, diag.Bound(m.Delivery.MessageId, 255), len(m.Msg.Payload)
			u.Reason = diag.Bound(m.HeadersError, valueMaxLength)
		}
	}
	if !m.PoisonedAt.IsZero() {
		if c.s.Oldest.IsZero() || m.PoisonedAt.Before(c.s.Oldest) {
			c.s.Oldest = m.PoisonedAt
		}
		if m.PoisonedAt.After(c.s.Newest) {
			c.s.Newest = m.PoisonedAt
		}
	}
}

// countItem counts the copy identity id once.
func (c *statsCounter) countItem(id string) {
	k := maphash.String(c.seed, id)
	if _, ok := c.items[k]; ok {
		return
	}
	c.s.Items++
	if len(c.items) < itemsTrackedMax {
		c.items[k] = struct{}{}
	} else {
		c.s.ItemsApproximate = true
	}
}

// Tracked is how many values the counter holds now, all groups together:
// at most 3 × capacity(top).
func (c *statsCounter) Tracked() int {
	return len(c.class.n) + len(c.fp.n) + len(c.eventType.n)
}

// Stats returns the counts so far.
func (c *statsCounter) Stats() Stats {
	s := c.s
	s.Approximate = nil
	var shown int
	s.ByClass, shown = c.class.top(s.Top)
	s.Other.Class = s.Total - shown
	s.ByFingerprint, shown = c.fp.top(s.Top)
	s.Other.Fingerprint = s.Total - shown
	s.ByEventType, shown = c.eventType.top(s.Top)
	s.Other.EventType = s.Total - shown
	for _, g := range []struct {
		name string
		c    *counters
	}{{"class", c.class}, {"fingerprint", c.fp}, {"event_type", c.eventType}} {
		if g.c.approx {
			s.Approximate = append(s.Approximate, g.name)
		}
	}
	return s
}

// counters is a Misra–Gries summary of at most cap values.
type counters struct {
	cap    int
	n      map[string]int
	approx bool // a value was dropped: the counts are lower bounds
}

func newCounters(capacity int) *counters {
	return &counters{cap: capacity, n: make(map[string]int)}
}

// add counts one occurrence of v. When v is new and every counter is
// taken, every count goes down by one (v's own included) and those at zero
// are dropped. Each such round takes cap+1 from the total counted, so over
// n values there are at most n/(cap+1) of them, of cap steps each: O(n).
func (c *counters) add(v string) {
	if _, ok := c.n[v]; ok || len(c.n) < c.cap {
		c.n[strings.Clone(v)]++ // not a slice of a larger string the map would keep alive
		return
	}
	c.approx = true
	for k, n := range c.n {
		if n <= 1 {
			delete(c.n, k)
		} else {
			c.n[k] = n - 1
		}
	}
}

// top returns the n most frequent values (ties by value) and the sum of
// their counts.
func (c *counters) top(n int) (map[string]int, int) {
	keys := make([]string, 0, len(c.n))
	for k := range c.n {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c.n[a] != c.n[b] {
			return c.n[b] - c.n[a]
		}
		return strings.Compare(a, b)
	})
	out := make(map[string]int, min(n, len(keys)))
	sum := 0
	for _, k := range keys[:min(n, len(keys))] {
		out[k] = c.n[k]
		sum += c.n[k]
	}
	return out, sum
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
