package bench

import "testing"

// go test -bench Overhead -benchmem ./internal/bench/
func BenchmarkOverhead(b *testing.B) {
	for _, bare := range []bool{true, false} {
		h, store, err := StackHandler(bare)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(map[bool]string{true: "bare", false: "stack"}[bare], func(b *testing.B) { BenchmarkDelivery(b, h, store) })
	}
}
