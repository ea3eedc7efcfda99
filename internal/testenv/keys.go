package testenv

import (
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// StringConstants returns the value of every string constant the package in
// dir declares at package level, by name, as the compiler computes it (a
// concatenation of constants is its value): the set of keys a test compares
// with what a document lists. Only the package's non-test files are read.
func StringConstants(t testing.TB, dir string) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, p, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Fatalf("%s: no Go file", dir)
	}
	pkg, err := (&types.Config{Importer: importer.Default()}).Check(files[0].Name.Name, fset, files, nil)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	consts := map[string]string{}
	for _, name := range pkg.Scope().Names() {
		if c, ok := pkg.Scope().Lookup(name).(*types.Const); ok && c.Val().Kind() == constant.String {
			consts[name] = constant.StringVal(c.Val())
		}
	}
	if len(consts) == 0 {
		t.Fatalf("%s declares no string constant", dir)
	}
	return consts
}

// TableKeys returns, in their order, the keys the first column of each row
// of a Markdown table holds — what the first group of key matches in it — in
// the file at path: the table whose header row is header. The test fails
// when the file has no such table.
func TableKeys(t testing.TB, path, header string, key *regexp.Regexp) []string {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "\n"+header+"\n")
	if start < 0 {
		t.Fatalf("%s has no table headed %q", path, header)
	}
	var keys []string
	for _, line := range strings.Split(text[start+1:], "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		for _, m := range key.FindAllStringSubmatch(strings.Split(line, "|")[1], -1) {
			keys = append(keys, m[1])
		}
	}
	return keys
}
