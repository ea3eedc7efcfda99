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

// Now is the time written into metadata: UTC, RFC 3339 with nanoseconds.
func Now() string { return time.Now().UTC().Format(time.RFC3339Nano) }
