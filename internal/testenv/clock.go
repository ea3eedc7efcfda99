package testenv

import (
	"sync"
	"time"

	"github.com/sluicemq/sluice"
)

// StoppedClock is a sluice.Clock that moves only when told (Advance), for
// what reads the time and schedules nothing: the console's sign-in
// throttle. Its AfterFunc panics.
type StoppedClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewStoppedClock returns a clock stopped at now.
func NewStoppedClock(now time.Time) *StoppedClock { return &StoppedClock{now: now} }

// Now is the time the clock stands at.
func (c *StoppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward.
func (c *StoppedClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// AfterFunc panics: a stopped clock runs no timers.
func (c *StoppedClock) AfterFunc(time.Duration, func()) sluice.Timer {
	panic("testenv.StoppedClock: no timers")
}
