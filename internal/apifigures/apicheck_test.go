package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// scripts/api.sh, the check make test runs against the last release's API,
// on a module of its own: a release written, then each kind of change —
// what a caller could not compile against any more fails the check, what
// only adds passes it.
func TestTheAPICheckFailsOnAnIncompatibleChange(t *testing.T) {
	if testing.Short() {
		t.Skip("builds apidiff")
	}
	script, err := filepath.Abs("../../scripts/api.sh")
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		path := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(src), 0o600))
	}
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command("bash", append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "API_ROOT="+dir)
		out, err := cmd.CombinedOutput()
		if exit, ok := err.(*exec.ExitError); ok {
			return string(out), exit.ExitCode()
		}
		require.NoError(t, err, "%s", out)
		return string(out), 0
	}
	const v1 = `package p

// F does f.
func F(n int) {}

// I is implemented by callers.
type I interface{ M() }

// S is a struct.
type S struct{ A int }
`
	write("go.mod", "module example.com/fixture\n\ngo 1.26\n")
	write("p/p.go", v1)
	write("q/q.go", "package q\n\n// G does g.\nfunc G() {}\n")
	write("internal/x/x.go", "package x\n\n// H is internal.\nfunc H() {}\n")

	out, code := run("check")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "no release under api/ yet")

	out, code = run("release", "v1.0.0")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "the API of 2 packages", "internal packages are not public")
	out, code = run("check")
	require.Equal(t, 0, code, out)

	for _, c := range []struct{ what, src, want string }{
		{"a changed signature", `package p
func F(n string) {}
type I interface{ M() }
type S struct{ A int }
`, "F: changed from func(int) to func(string)"},
		{"a method added to an interface", `package p
func F(n int) {}
type I interface{ M(); N() }
type S struct{ A int }
`, "I.N: added"},
		{"a field removed", `package p
func F(n int) {}
type I interface{ M() }
type S struct{}
`, "S.A: removed"},
	} {
		write("p/p.go", c.src)
		out, code = run("check")
		require.Equal(t, 1, code, "%s: %s", c.what, out)
		require.Contains(t, out, c.want, c.what)
		require.Contains(t, out, "example.com/fixture/p changed incompatibly since v1.0.0", c.what)
	}

	write("p/p.go", v1+"\n// G is new.\nfunc G() {}\n")
	write("internal/x/x.go", "package x\n")
	out, code = run("check")
	require.Equal(t, 0, code, "an addition, and a change inside internal/, are compatible: %s", out)

	require.NoError(t, os.RemoveAll(filepath.Join(dir, "q")))
	out, code = run("check")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "example.com/fixture/q: the package is gone")
}
