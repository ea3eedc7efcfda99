package bench

import (
	"fmt"
	"os"
	"testing"
)

// TestMain runs the test binary as a consumer process of the scaleout suite
// when ScaleOutWorkerEnv is set (TestScaleOutSuiteRuns starts it so).
func TestMain(m *testing.M) {
	if cfg := os.Getenv(ScaleOutWorkerEnv); cfg != "" {
		if err := ScaleOutWorker(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "scaleout worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
