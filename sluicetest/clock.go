package sluicetest

import (
	"slices"
	"sync"
	"time"

	"github.com/sluicemq/sluice"
)

// epoch is where a Harness's virtual clock starts.
var epoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// virtualClock is a sluice.Clock that moves only when told: the retry
// tiers' delays and the brake's cool-downs of a Harness wait on it, so
// Harness.Advance runs a 30-minute tier at once. Safe for concurrent use.
type virtualClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    int
	timers []*virtualTimer
}

var _ sluice.Clock = (*virtualClock)(nil)

// newVirtualClock returns a clock stopped at start.
func newVirtualClock(start time.Time) *virtualClock { return &virtualClock{now: start} }

type virtualTimer struct {
	c   *virtualClock
	due time.Time
	seq int
	f   func()
}

// Now returns the virtual time.
func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d; it runs when the clock is moved past it.
func (c *virtualClock) AfterFunc(d time.Duration, f func()) sluice.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &virtualTimer{c: c, due: c.now.Add(max(d, 0)), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *virtualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	i := slices.Index(t.c.timers, t)
	if i < 0 {
		return false
	}
	t.c.timers = slices.Delete(t.c.timers, i, i+1)
	return true
}

func (c *virtualClock) earliest() *virtualTimer {
	e := c.timers[0]
	for _, t := range c.timers[1:] {
		if t.due.Before(e.due) || (t.due.Equal(e.due) && t.seq < e.seq) {
			e = t
		}
	}
	return e
}

// fireDue moves the clock to the earliest call due at or before until, runs
// every call due then (in the order they were scheduled), and reports
// whether it ran any.
func (c *virtualClock) fireDue(until time.Time) bool {
	c.mu.Lock()
	if len(c.timers) == 0 || c.earliest().due.After(until) {
		c.mu.Unlock()
		return false
	}
	at := c.earliest().due
	c.now = at
	var due []*virtualTimer
	c.timers = slices.DeleteFunc(c.timers, func(t *virtualTimer) bool {
		if !t.due.After(at) {
			due = append(due, t)
			return true
		}
		return false
	})
	c.mu.Unlock()
	slices.SortFunc(due, func(a, b *virtualTimer) int { return a.seq - b.seq })
	for _, t := range due {
		t.f()
	}
	return true
}

// set moves the clock to t when t is later.
func (c *virtualClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}
