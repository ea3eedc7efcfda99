package clustertest_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if err := closeCluster(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the private cluster:", err)
			code = max(code, 1)
		}
		os.Exit(code)
	}))
}
