package bench

import (
	"fmt"
	"os"
	"testing"
)

// TestMain runs the test binary as a child process of a suite when the
// environment says it is one (TestScaleOutSuiteRuns and
// TestOutboxMemorySuiteRuns start it so).
func TestMain(m *testing.M) {
	if ran, err := Worker(); ran {
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
