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
	return await(want, stall, limit, count, func(n int) bool { return n > want },
		func(n int) string { return fmt.Sprintf("%d of %d", n, want) })
}

// AwaitDrained waits, as AwaitCount waits for a count, until left() (a
// queue's depth, the rows still to go) returns 0: it returns an error when
// left has not moved, up or down, for stall, or when limit has passed in
// all. A negative left is returned as an error at once.
func AwaitDrained(stall, limit time.Duration, left func() int) error {
	return await(0, stall, limit, left, func(n int) bool { return n < 0 },
		func(n int) string { return fmt.Sprintf("%d left", n) })
}

// await polls value until it returns want; any change is progress, and a
// value past want (past says which) ends the wait at once.
func await(want int, stall, limit time.Duration, value func() int, past func(int) bool, show func(int) string) error {
	start := time.Now()
	last, moved := value(), time.Now()
	for last != want {
		if past(last) {
			return fmt.Errorf("%s, past the %d wanted", show(last), want)
		}
		now := time.Now()
		if now.Sub(moved) >= stall {
			return fmt.Errorf("%s, unchanged for %s (%s in all)", show(last), stall, now.Sub(start).Round(time.Second))
		}
		if now.Sub(start) >= limit {
			return fmt.Errorf("%s after %s, still moving", show(last), limit)
		}
		time.Sleep(50 * time.Millisecond)
		if n := value(); n != last {
			last, moved = n, time.Now()
		}
	}
	return nil
}
