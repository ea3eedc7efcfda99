package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// What the package's tests share, made by the first test that needs it and
// removed by TestMain (closeShared): the CLI's binary — a go build.
var shared struct {
	binOnce sync.Once
	binDir  string
	bin     string
	binErr  error
}

// buildCLI builds the real binary, once for the package, for a test to
// run, signal and kill.
func buildCLI(t *testing.T) string {
	t.Helper()
	shared.binOnce.Do(func() {
		if shared.binDir, shared.binErr = os.MkdirTemp("", "sluice-cli-"); shared.binErr != nil {
			return
		}
		shared.bin = filepath.Join(shared.binDir, "sluice")
		out, err := exec.Command("go", "build", "-o", shared.bin, ".").CombinedOutput()
		if err != nil {
			shared.binErr = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	require.NoError(t, shared.binErr)
	return shared.bin
}

// closeShared removes the binary, if a test made it.
func closeShared() error {
	if shared.binDir != "" {
		return os.RemoveAll(shared.binDir)
	}
	return nil
}

// closingShared runs the tests, then closeShared, before goleak looks for
// leaks.
type closingShared struct{ m *testing.M }

func (c closingShared) Run() int {
	code := c.m.Run()
	if err := closeShared(); err != nil {
		fmt.Fprintln(os.Stderr, "closing what the tests shared:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
