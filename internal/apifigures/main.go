// Command apifigures prints the figures of Sluice's public surface that
// docs/architecture.md quotes (make figures): the exported names of each
// public package and in all, the config structs and their fields, the Sluice
// packages the README's Go code imports, and the modules a user's program
// links for the inbox and the classifier alone.
//
// An exported name is a top-level exported constant, variable, type or
// function of a non-test, non-generated file, or an exported method of an
// exported type. A config struct is an exported struct type whose name ends
// in Config; its fields are its exported fields, embedded ones included.
// Packages under internal/ and the cmd and examples modules are not public.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

const module = "github.com/sluicemq/sluice"

type pkgFigures struct {
	path          string
	names         int
	configs       int
	configFields  int
	exportedNames []string
}

func main() {
	root := flag.String("root", ".", "the repository's root")
	list := flag.Bool("list", false, "list every exported name, one a line")
	flag.Parse()
	if err := run(*root, *list); err != nil {
		fmt.Fprintln(os.Stderr, "apifigures:", err)
		os.Exit(1)
	}
}

func run(root string, list bool) error {
	pkgs, err := publicPackages(root)
	if err != nil {
		return err
	}
	if list {
		for _, p := range pkgs {
			for _, n := range p.exportedNames {
				fmt.Printf("%s.%s\n", p.path, n)
			}
		}
		return nil
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	var names, configs, fields int
	fmt.Fprintf(w, "%-52s %6s %8s %7s\n", "package", "names", "configs", "fields")
	for _, p := range pkgs {
		fmt.Fprintf(w, "%-52s %6d %8d %7d\n", p.path, p.names, p.configs, p.configFields)
		names, configs, fields = names+p.names, configs+p.configs, fields+p.configFields
	}
	fmt.Fprintf(w, "%-52s %6d %8d %7d\n", fmt.Sprintf("all (%d packages)", len(pkgs)), names, configs, fields)

	blocks, err := readmeImports(filepath.Join(root, "README.md"))
	if err != nil {
		return err
	}
	fmt.Fprintln(w)
	for i, imports := range blocks {
		fmt.Fprintf(w, "Sluice packages the README's import block %d names: %d (%s)\n", i+1, len(imports), strings.Join(imports, ", "))
	}

	mods, err := modules(root, "./deduplication", "./stage")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "modules a program linking deduplication and stage alone builds with: %d\n", len(mods))
	for _, m := range mods {
		fmt.Fprintf(w, "  %s\n", m)
	}
	return nil
}

// publicPackages walks the root module's public packages.
func publicPackages(root string) ([]pkgFigures, error) {
	var out []pkgFigures
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		base := d.Name()
		if rel != "." && (base == "internal" || base == "testdata" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_")) {
			return filepath.SkipDir
		}
		if rel != "." {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module: cmd, examples
			}
		}
		p, ok, err := figures(path)
		if err != nil || !ok {
			return err
		}
		p.path = module
		if rel != "." {
			p.path += "/" + filepath.ToSlash(rel)
		}
		out = append(out, p)
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, err
}

var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// figures counts one directory's package; ok is false if it has no Go file.
func figures(dir string) (p pkgFigures, ok bool, err error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return p, false, err
	}
	exportedTypes := map[string]bool{}
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return p, false, err
		}
		if generated.Match(src) {
			continue
		}
		f, err := parser.ParseFile(fset, n, src, parser.SkipObjectResolution)
		if err != nil {
			return p, false, err
		}
		if f.Name.Name == "main" {
			return p, false, nil
		}
		files = append(files, f)
		for _, decl := range f.Decls {
			if g, isGen := decl.(*ast.GenDecl); isGen && g.Tok == token.TYPE {
				for _, s := range g.Specs {
					if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
						exportedTypes[ts.Name.Name] = true
					}
				}
			}
		}
	}
	if len(files) == 0 {
		return p, false, nil
	}
	add := func(name string) {
		p.names++
		p.exportedNames = append(p.exportedNames, name)
	}
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					add(d.Name.Name)
					continue
				}
				if recv := receiver(d.Recv.List[0].Type); exportedTypes[recv] {
					add(recv + "." + d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								add(n.Name)
							}
						}
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						add(s.Name.Name)
						st, isStruct := s.Type.(*ast.StructType)
						if !isStruct || !strings.HasSuffix(s.Name.Name, "Config") {
							continue
						}
						p.configs++
						for _, fld := range st.Fields.List {
							if len(fld.Names) == 0 { // embedded
								if receiverExported(fld.Type) {
									p.configFields++
								}
								continue
							}
							for _, n := range fld.Names {
								if n.IsExported() {
									p.configFields++
								}
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(p.exportedNames)
	return p, true, nil
}

// receiver names a method receiver's type: T, *T, T[K] or *T[K].
func receiver(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiver(t.X)
	case *ast.IndexExpr:
		return receiver(t.X)
	case *ast.IndexListExpr:
		return receiver(t.X)
	case *ast.Ident:
		return t.Name
	}
	return ""
}

// receiverExported says whether an embedded field's type name is exported.
func receiverExported(e ast.Expr) bool {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiverExported(t.X)
	case *ast.SelectorExpr:
		return t.Sel.IsExported()
	case *ast.Ident:
		return t.IsExported()
	}
	return false
}

var (
	goBlock     = regexp.MustCompile("(?s)```go\n(.*?)```")
	importPaths = regexp.MustCompile(`"(` + regexp.QuoteMeta(module) + `[^"]*)"`)
)

// readmeImports lists, for each of the README's Go blocks with an import
// declaration, the Sluice packages it imports.
func readmeImports(readme string) ([][]string, error) {
	b, err := os.ReadFile(readme)
	if err != nil {
		return nil, err
	}
	var out [][]string
	for _, block := range goBlock.FindAllStringSubmatch(string(b), -1) {
		if !strings.Contains(block[1], "import (") {
			continue
		}
		var imports []string
		for _, m := range importPaths.FindAllStringSubmatch(block[1], -1) {
			imports = append(imports, strings.TrimPrefix(m[1], module+"/"))
		}
		out = append(out, imports)
	}
	return out, nil
}

// modules lists the modules other than Sluice's that the packages build with.
func modules(root string, pkgs ...string) ([]string, error) {
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}"}, pkgs...)...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	seen := map[string]bool{}
	var mods []string
	for _, m := range strings.Fields(string(out)) {
		if m != module && !seen[m] {
			seen[m] = true
			mods = append(mods, m)
		}
	}
	sort.Strings(mods)
	return mods, nil
}
