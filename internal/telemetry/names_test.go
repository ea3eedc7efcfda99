package telemetry

import (
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// docNames matches what docs/observability.md writes in backquotes for a
// name of Sluice's telemetry: a dotted lower-case name in Sluice's
// namespace or the semantic conventions' messaging and error namespaces,
// alone or with a value (`sluice.outcome = held`, `error.type=exhausted`).
var docNames = regexp.MustCompile("`((?:sluice|messaging|error)\\.[a-z0-9_]+(?:\\.[a-z0-9_]+)*)(?:\\s*=[^`]*)?`")

// literalName matches a string literal that is a name of Sluice's
// telemetry, which only names.go may hold.
var literalName = regexp.MustCompile(`^(?:sluice|messaging)\.[a-z0-9_]+(?:\.[a-z0-9_]+)*$`)

// definedNames returns the value of every constant names.go defines by a
// literal ("…" or attribute.Key("…")), by constant.
func definedNames(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "names.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, id := range vs.Names {
				v := vs.Values[i]
				if c, ok := v.(*ast.CallExpr); ok && len(c.Args) == 1 {
					v = c.Args[0]
				}
				lit, ok := v.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("names.go: %s is not a literal name: write its value in names.go", id.Name)
				}
				name, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				names[id.Name] = name
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("names.go defines no name")
	}
	return names
}

// Users take the names of instruments and attributes from
// docs/observability.md, not from Go constants: the document must name
// every instrument, span and attribute names.go defines (and every
// semantic-conventions attribute Sluice sets), and no name in those
// namespaces that the code does not define.
func TestTheDocsNameEveryInstrumentAndAttribute(t *testing.T) {
	defined := definedNames(t)
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range docNames.FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	known := map[string]bool{}
	for c, name := range defined {
		known[name] = true
		if !documented[name] {
			t.Errorf("docs/observability.md does not name %q (telemetry.%s)", name, c)
		}
	}
	for _, k := range SemconvAttributes {
		known[string(k)] = true
		if !documented[string(k)] {
			t.Errorf("docs/observability.md does not name %q (telemetry.SemconvAttributes)", k)
		}
	}
	var unknown []string
	for name := range documented {
		if !known[name] {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		t.Errorf("docs/observability.md names %q, which the code does not define (internal/telemetry/names.go)", name)
	}
}

// A name written as a literal outside names.go would escape the check
// above: every non-test file of the root module must take its names from
// here.
func TestTelemetryNamesAreDefinedInNamesGo(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	self, err := filepath.Abs("names.go")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module (cmd, examples)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == self {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		fset := token.NewFileSet()
		var s scanner.Scanner
		s.Init(fset.AddFile(path, -1, len(src)), src, nil, 0)
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok != token.STRING {
				continue
			}
			if v, err := strconv.Unquote(lit); err == nil && literalName.MatchString(v) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d: %q is a telemetry name written in place: define it in internal/telemetry/names.go (and name it in docs/observability.md)",
					rel, fset.Position(pos).Line, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("scanned %d files of the root module: the walk missed it", files)
	}
}
