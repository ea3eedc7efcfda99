package testenv

import (
	"bytes"
	"runtime/pprof"
)

// Goroutines is every goroutine's stack, as a panic prints them: what a
// test that found a wait unbounded prints, so that its failure says what
// waited.
func Goroutines() string {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return b.String()
}
