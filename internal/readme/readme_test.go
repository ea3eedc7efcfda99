// Package readme checks that the Go snippets in README.md and docs/ are
// compiled code: each one must appear, line for line (indentation, blank and
// comment-only lines aside), in a .go file of the repository — an Example or a
// helper it runs, or the declaration a snippet quotes.
package readme

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

func TestSnippetsAreCompiled(t *testing.T) {
	root := filepath.Join("..", "..")
	var code strings.Builder
	require.NoError(t, filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		b, err := os.ReadFile(path)
		code.WriteString(normalize(string(b)))
		return err
	}))
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	checked := 0
	for _, doc := range append(docs, filepath.Join(root, "README.md")) {
		b, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, m := range goBlock.FindAllStringSubmatch(string(b), -1) {
			checked++
			require.True(t, strings.Contains(code.String(), normalize(unquote(m[1]))), "this Go snippet in %s is not in any .go file:\n%s", doc, m[1])
		}
	}
	require.NotZero(t, checked, "README.md has Go snippets")
}

// unquote drops a blockquote's "> " from a snippet quoted in one (an
// issue text for upstream in docs/rabbitmq.md).
func unquote(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, ">") && strings.TrimSpace(l) != "" {
			return s // not a quoted snippet
		}
		lines[i] = strings.TrimPrefix(strings.TrimPrefix(l, ">"), " ")
	}
	return strings.Join(lines, "\n")
}

// normalize drops indentation, blank lines and comment-only lines.
func normalize(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "//") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n") + "\n"
}
