package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/testenv"
)

// What the package's tests share, made by the first test that needs it and
// removed by TestMain (closeShared): a private RabbitMQ node (an Erlang
// VM's boot: about 4 CPU-seconds, 8 to 20 s at load average 15), the
// CLI's binary (a go build) and a headless Chromium (a browser of each
// test's own cost the eight tests about 5 CPU-seconds more).
var shared struct {
	nodeOnce sync.Once
	node     *testenv.PrivateRabbitMQ
	ca       []byte // the CA of the node's TLS listener, PEM
	nodeErr  error

	binOnce sync.Once
	binDir  string
	bin     string
	binErr  error

	browserOnce  sync.Once
	browser      context.Context // the browser's first tab, which it lives as long as
	browserErr   error
	closeBrowser func() // stops the browser and removes its profile
}

// privateNode returns the package's private RabbitMQ node, with the
// management plugin and a TLS listener (trusted by ca, PEM), in a vhost of
// t's own: the tests that need the management API or TLS share one node,
// each seeing only its own queues (fixed names included).
func privateNode(t *testing.T) (node *testenv.PrivateRabbitMQ, ca []byte) {
	t.Helper()
	shared.nodeOnce.Do(func() {
		start := time.Now()
		files, _ := testenv.TestCA(t)
		shared.ca = files.CA
		shared.node, shared.nodeErr = testenv.StartRabbitMQ(testenv.PrivateRabbitMQOptions{Management: true, TLS: &files})
		t.Logf("private RabbitMQ node (management, TLS) started in %s", time.Since(start).Round(time.Millisecond))
	})
	require.NoError(t, shared.nodeErr, "starting the package's private RabbitMQ node")
	require.NotNil(t, shared.node, "the package's private RabbitMQ node was not started: see the first test that asked for it")
	return shared.node.VHost(t), shared.ca
}

// buildCLI builds the real binary, once for the package, for a test to
// run, signal and kill.
func buildCLI(t *testing.T) string {
	t.Helper()
	shared.binOnce.Do(func() {
		if shared.binDir, shared.binErr = os.MkdirTemp("", "sluice-cli-"); shared.binErr != nil {
			return
		}
		if shared.binErr = testenv.ClaimDir(shared.binDir); shared.binErr != nil {
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

// sharedBrowser returns the package's headless Chromium (Debian's; t is
// skipped without it), started by the first test that asks: browser opens
// each test's tab in it.
func sharedBrowser(t *testing.T) context.Context {
	t.Helper()
	const path = "/usr/bin/chromium"
	if _, err := os.Stat(path); err != nil {
		t.Skip("no /usr/bin/chromium: make services installs it")
	}
	shared.browserOnce.Do(func() {
		profile, err := os.MkdirTemp("", "sluice-chromium-")
		if err == nil {
			err = testenv.ClaimDir(profile)
		}
		if err != nil {
			shared.browserErr = err
			return
		}
		opts := []chromedp.ExecAllocatorOption{
			chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
			chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
			chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 900),
		}
		actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
		bctx, cancelB := chromedp.NewContext(actx)
		shared.browser = bctx
		shared.closeBrowser = func() { cancelB(); cancelA(); _ = os.RemoveAll(profile) }
		shared.browserErr = chromedp.Do(bctx) // starts it: a failure names the browser
	})
	require.NoError(t, shared.browserErr, "starting %s", path)
	return shared.browser
}

// closeShared stops the shared node and browser and removes the binary, if
// a test made them.
func closeShared() error {
	var err error
	if shared.closeBrowser != nil {
		shared.closeBrowser()
	}
	if shared.node != nil {
		err = shared.node.Close()
	}
	if shared.binDir != "" {
		err = errors.Join(err, os.RemoveAll(shared.binDir))
	}
	return err
}

// closingShared runs the tests, then closeShared: before goleak looks for
// leaks, so that no connection to the shared node or browser is left open.
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
