package testenv

import (
	"fmt"
	"testing"
	"time"
)

// Within runs f and fails t (t.Fatalf "<what> did not return within <d>")
// unless it returns within d; it returns how long f took, for the test's
// own bound. d is the test's patience, not the bound under test: a call
// that hangs fails the test here instead of holding it until go test's
// timeout.
func Within(t testing.TB, d time.Duration, what string, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("%s did not return within %s", what, d)
		return 0
	}
}

// AwaitCount waits until count() returns want, polling it, and returns an
// error (nil once it does) when count has not moved for stall — something
// is stuck, not slow — or when limit has passed in all. It is the wait for
// a large batch of asynchronous effects: a fixed bound on the whole batch
// measures the machine's speed (5,000 rows through a restarted database
// took more than 2 minutes at a load average of 37) where a stall is what
// a lost or stuck delivery looks like. A count past want is returned as an
// error at once.
func AwaitCount(want int, stall, limit time.Duration, count func() int) error {
	start := time.Now()
	last, moved := count(), time.Now()
	for last != want {
		if last > want {
			return fmt.Errorf("%d, more than the %d wanted", last, want)
		}
		now := time.Now()
		if now.Sub(moved) >= stall {
			return fmt.Errorf("%d of %d, unchanged for %s (%s in all)", last, want, stall, now.Sub(start).Round(time.Second))
		}
		if now.Sub(start) >= limit {
			return fmt.Errorf("%d of %d after %s, still moving", last, want, limit)
		}
		time.Sleep(50 * time.Millisecond)
		if n := count(); n != last {
			last, moved = n, time.Now()
		}
	}
	return nil
}
