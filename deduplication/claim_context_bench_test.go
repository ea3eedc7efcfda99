package deduplication

import (
	"context"
	"testing"
	"time"
)

// What the claim deadline costs when a store watches the context, as a
// database/sql driver does: the lazy claim context against
// context.WithTimeout. go test -run '^$' -bench ClaimDeadline ./deduplication/
func BenchmarkClaimDeadline(b *testing.B) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch := func(ctx context.Context) { // a driver's watch: Done, then the query returns
		select {
		case <-ctx.Done():
		default:
		}
	}
	b.Run("lazy, watched", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := newClaimContext(parent, 5*time.Second)
			watch(c)
			c.release()
		}
	})
	b.Run("lazy, not watched", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := newClaimContext(parent, 5*time.Second)
			c.release()
		}
	})
	b.Run("WithTimeout", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c, cancel := context.WithTimeout(parent, 5*time.Second)
			watch(c)
			cancel()
		}
	})
}
