// Package clock holds time helpers shared by the stages.
package clock

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, whichever comes first.
func Sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Stamp is how a time is written into metadata: UTC, RFC 3339 with
// nanoseconds. Take the time from the stage's sluice.Clock, never
// time.Now, so the test kit's virtual clock reaches it.
func Stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
