package sluice_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The package table of docs/architecture.md is the package graph: each
// library package has a row, and the row's imports of the module (its
// internal plumbing aside) are what go list says it imports.
func TestTheArchitectureTableIsThePackageGraph(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/architecture.md")
	require.NoError(t, err)
	const header = "| package | imports of the module (`internal/` aside) | holds |"
	text := string(doc)
	start := strings.Index(text, header)
	require.GreaterOrEqual(t, start, 0, "docs/architecture.md has the package table")
	name := regexp.MustCompile("`([a-z0-9/]+)`")
	rows := map[string][]string{}
	for _, line := range strings.Split(text[start:], "\n")[2:] {
		if !strings.HasPrefix(line, "| `") {
			break
		}
		cols := strings.Split(line, "|")
		require.GreaterOrEqual(t, len(cols), 4, "row %q", line)
		pkg := name.FindStringSubmatch(cols[1])[1]
		var imports []string
		for _, m := range name.FindAllStringSubmatch(cols[2], -1) {
			imports = append(imports, m[1])
		}
		slices.Sort(imports)
		rows[pkg] = imports
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	short := func(p string) string {
		if p == module {
			return "sluice"
		}
		return strings.TrimPrefix(p, module+"/")
	}
	internal := regexp.MustCompile(`(^|/)(internal|cmd|examples)(/|$)`)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := short(f[0])
		if !strings.HasPrefix(f[0], module) || internal.MatchString(pkg) {
			continue
		}
		var imports []string
		for _, imp := range f[1:] {
			if (imp == module || strings.HasPrefix(imp, module+"/")) && !internal.MatchString(short(imp)) {
				imports = append(imports, short(imp))
			}
		}
		slices.Sort(imports)
		got, ok := rows[pkg]
		require.True(t, ok, "docs/architecture.md's package table has no row for %s", pkg)
		require.Equal(t, imports, got, "docs/architecture.md's row for %s names other imports than go list", pkg)
		delete(rows, pkg)
	}
	require.Empty(t, rows, "docs/architecture.md's package table has rows for packages that do not exist")
}
