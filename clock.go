package sluice

import "time"

// Clock is where the stages take their time from: the brake's cool-down,
// the embedded broker's retry tiers, and the times the retry and poison
// stages stamp on their copies. Default SystemClock; the test kit (package
// sluicetest) gives a virtual one, so a test runs a 30-minute tier in a
// moment. Implementations are safe for concurrent use.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or the clock's) once d has
	// passed, as time.AfterFunc does.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a function scheduled by a Clock.
type Timer interface {
	// Stop prevents the call; false when it already ran or was stopped.
	Stop() bool
}

// SystemClock returns the real clock: time.Now and time.AfterFunc.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
