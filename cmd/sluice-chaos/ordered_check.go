package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
)

// orderPlan is the ordered scenario's messages: keys × perKey, published
// in each key's order (seq 0, 1, …), the keys interleaved.
type orderPlan struct {
	keys   []string
	perKey int
	// fail is how many times an event fails transiently before it
	// succeeds (event id → 1 or 2).
	fail map[string]int
	// poisonAt is, for a key whose head is poisoned, the seq of the
	// message the handler poisons.
	poisonAt  map[string]int
	publishes []orderedEvent
}

// orderedEvent is one message of the ordered scenario: its payload.
type orderedEvent struct {
	EventID   string `json:"eventId"`
	Key       string `json:"key"`
	Seq       int    `json:"seq"`
	FailTimes int    `json:"failTimes,omitempty"`
	Poison    bool   `json:"poison,omitempty"`
}

func orderedEventID(key string, seq int) string { return fmt.Sprintf("%s-%d", key, seq) }

// makeOrderPlan draws the plan: failure of each message with probability
// failProb (a third of them twice), poisoned keys' heads anywhere in the
// key but its last message. Each round publishes every key's next message,
// the keys in a new random order.
func makeOrderPlan(rng *rand.Rand, keys, perKey, poisoned int, failProb float64) orderPlan {
	p := orderPlan{perKey: perKey, fail: map[string]int{}, poisonAt: map[string]int{}}
	for k := range keys {
		p.keys = append(p.keys, fmt.Sprintf("k%04d", k))
	}
	for _, i := range rng.Perm(keys)[:min(poisoned, keys)] {
		p.poisonAt[p.keys[i]] = rng.IntN(max(perKey-1, 1))
	}
	order := slices.Clone(p.keys)
	for seq := range perKey {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, key := range order {
			e := orderedEvent{EventID: orderedEventID(key, seq), Key: key, Seq: seq}
			if at, ok := p.poisonAt[key]; ok && at == seq {
				e.Poison = true
			} else if rng.Float64() < failProb {
				e.FailTimes = 1
				if rng.IntN(3) == 0 {
					e.FailTimes = 2
				}
				p.fail[e.EventID] = e.FailTimes
			}
			p.publishes = append(p.publishes, e)
		}
	}
	return p
}

// want returns the seqs key must have applied, in order: every one; for a
// key with a poisoned head, those before it and, once the head was
// skipped, those after it.
func (p orderPlan) want(key string, skipped bool) []int {
	at, poisoned := p.poisonAt[key]
	var s []int
	for seq := range p.perKey {
		switch {
		case !poisoned, seq < at, skipped && seq > at:
			s = append(s, seq)
		}
	}
	return s
}

// reachable is how many effects the plan can have before (and after) the
// poisoned heads are skipped.
func (p orderPlan) reachable(skipped bool) int {
	n := 0
	for _, k := range p.keys {
		n += len(p.want(k, skipped))
	}
	return n
}

// orderViolation is one key whose committed effects differ from the plan.
type orderViolation struct {
	key  string
	kind string // "out of order", "twice", "missing", "unexpected"
	text string
}

func (v orderViolation) String() string { return v.key + ": " + v.kind + ": " + v.text }

// checkOrder compares each key's committed effects (its seqs in commit
// order) with the plan: the publish sequence, each once — for a key with
// a poisoned head, exactly the messages before the head and, once it was
// skipped, the rest in order. It returns one violation per key that
// differs, sorted by key.
func checkOrder(p orderPlan, applied map[string][]int, skipped bool) []orderViolation {
	var out []orderViolation
	for _, key := range p.keys {
		got, want := applied[key], p.want(key, skipped)
		if slices.Equal(got, want) {
			continue
		}
		out = append(out, orderViolation{key: key, kind: violationKind(got, want), text: firstDifference(got, want)})
	}
	known := map[string]bool{}
	for _, k := range p.keys {
		known[k] = true
	}
	for key, got := range applied {
		if !known[key] {
			out = append(out, orderViolation{key: key, kind: "unexpected", text: fmt.Sprintf("%d effects of a key never published", len(got))})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

func violationKind(got, want []int) string {
	seen, wanted := map[int]int{}, map[int]bool{}
	for _, s := range want {
		wanted[s] = true
	}
	for _, s := range got {
		seen[s]++
		if seen[s] > 1 {
			return "twice"
		}
		if !wanted[s] {
			return "unexpected"
		}
	}
	if len(got) < len(want) {
		return "missing"
	}
	return "out of order"
}

// firstDifference describes where got first departs from want, briefly.
func firstDifference(got, want []int) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	at := func(s []int) string {
		if i < len(s) {
			return fmt.Sprint(s[i])
		}
		return "nothing"
	}
	return fmt.Sprintf("effect #%d is seq %s, want seq %s (%d effects, want %d): %v", i, at(got), at(want), len(got), len(want), brief(got))
}

// brief prints a sequence, its middle elided past 24 elements.
func brief(s []int) string {
	if len(s) <= 24 {
		return fmt.Sprint(s)
	}
	return fmt.Sprintf("%v … %v", s[:12], s[len(s)-12:])
}
