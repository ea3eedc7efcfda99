package testenv

import (
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
