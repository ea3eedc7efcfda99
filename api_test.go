package sluice_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The public API names only public types: a caller outside the module cannot
// name a type of an internal package, so an exported function, method,
// field, variable or constant of a public package whose type is written
// with one is a function that caller cannot fully use (before: rabbitmq.Dial
// returned *amqp.Connection of internal/amqp091, and its doc promised
// errors.Is(err, amqp.ErrCredentials), which nobody outside could write).
//
// The test walks every exported declaration of every public package of the
// module, from the compiler's export data (so aliases are seen as written),
// and every exported method and field of the module's types reachable from
// them. It fails when a public package's declaration writes a type of an
// internal package, and when a type of an internal package reachable from the
// API has no public alias to name it by. (The AMQP client's types are
// upstream amqp091-go's own since issue 42: no alias needed.)
func TestThePublicAPINamesNoInternalType(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the export data of every package")
	}
	t.Parallel()
	pkgs, imp := moduleTypes(t)
	var public []*types.Package
	for path, p := range pkgs {
		if p.Module == nil || p.Module.Path != module || isInternal(path) || p.Name == "main" {
			continue
		}
		public = append(public, importPackage(t, imp, path))
	}
	require.Greater(t, len(public), 10, "the module's public packages")

	w := apiWalker{aliased: map[*types.TypeName]string{}, seen: map[types.Type]bool{}}
	for _, p := range public { // the internal types a public alias names
		for _, name := range p.Scope().Names() {
			if tn, ok := p.Scope().Lookup(name).(*types.TypeName); ok && tn.Exported() && tn.IsAlias() {
				if n, ok := types.Unalias(tn.Type()).(*types.Named); ok {
					w.aliased[n.Obj()] = p.Path() + "." + name
				}
			}
		}
	}
	for _, p := range public {
		for _, name := range p.Scope().Names() {
			obj := p.Scope().Lookup(name)
			if obj.Exported() {
				w.object(obj, p.Path()+"."+name)
			}
		}
	}
	slices.Sort(w.problems)
	require.Empty(t, w.problems, "exported API that names a type of an internal package:\n%s", strings.Join(w.problems, "\n"))
}

type listedPackage struct {
	ImportPath, Name, Export string
	Module                   *struct{ Path string }
}

var exported struct {
	once sync.Once
	pkgs map[string]listedPackage
	imp  types.Importer
	err  error
	mu   sync.Mutex // imp is not safe for concurrent use
}

// moduleTypes builds the module's packages (once per test binary) and
// returns every package they depend on, by import path, with its export
// data file, and an importer that reads them.
func moduleTypes(t *testing.T) (map[string]listedPackage, types.Importer) {
	t.Helper()
	exported.once.Do(func() {
		exported.pkgs, exported.err = exportData()
		fset := token.NewFileSet()
		exported.imp = importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			p, ok := exported.pkgs[path]
			if !ok || p.Export == "" {
				return nil, fmt.Errorf("no export data for %s", path)
			}
			return os.Open(p.Export)
		})
	})
	require.NoError(t, exported.err)
	return exported.pkgs, exported.imp
}

func importPackage(t *testing.T, imp types.Importer, path string) *types.Package {
	t.Helper()
	exported.mu.Lock()
	defer exported.mu.Unlock()
	p, err := imp.Import(path)
	require.NoError(t, err, path)
	return p
}

func exportData() (map[string]listedPackage, error) {
	// The same build as the test binary's (the workspace's module graph,
	// -race when it has it): the export data are then those `go test`
	// already built, read from the cache, not a second build of every
	// package and dependency (minutes on a fresh machine).
	args := []string{"list", "-export", "-deps", "-json=ImportPath,Name,Export,Module", "./..."}
	if raceEnabled {
		args = append(args[:1], append([]string{"-race"}, args[1:]...)...)
	}
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.String())
	}
	pkgs := map[string]listedPackage{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, err
		}
		pkgs[p.ImportPath] = p
	}
}

func isInternal(path string) bool {
	return strings.HasSuffix(path, "/internal") || strings.Contains(path, "/internal/")
}

// apiWalker collects the places where the API names an internal type.
type apiWalker struct {
	aliased  map[*types.TypeName]string // internal named type → its public alias
	seen     map[types.Type]bool
	problems []string
}

func (w *apiWalker) object(obj types.Object, where string) {
	switch o := obj.(type) {
	case *types.TypeName:
		if o.IsAlias() {
			w.typ(types.Unalias(o.Type()), where, true)
			return
		}
		w.members(o.Type(), where)
	case *types.Func, *types.Var, *types.Const:
		w.typ(o.Type(), where, false)
	}
}

// members walks the exported methods and struct fields of the named type t
// of the module (declared in a public package, or an internal one with a
// public alias).
func (w *apiWalker) members(t types.Type, where string) {
	if w.seen[t] {
		return
	}
	w.seen[t] = true
	n, ok := t.(*types.Named)
	if !ok {
		return
	}
	ms := types.NewMethodSet(types.NewPointer(n))
	for m := range ms.Methods() {
		if m.Obj().Exported() && m.Obj().Pkg() == n.Obj().Pkg() { // promoted methods are walked with their own type
			w.typ(m.Type(), where+"."+m.Obj().Name(), isInternal(n.Obj().Pkg().Path()))
		}
	}
	if s, ok := n.Underlying().(*types.Struct); ok {
		for f := range s.Fields() {
			if f.Exported() {
				w.typ(f.Type(), where+"."+f.Name(), isInternal(n.Obj().Pkg().Path()))
			}
		}
	} else {
		w.typ(n.Underlying(), where, isInternal(n.Obj().Pkg().Path()))
	}
}

// typ walks t, written in a declaration of where; aliasOK says an internal
// type may be written there if a public alias names it: the declaration is
// an internal package's (reached through a public alias, it writes its own
// types by their internal names), or t is what a public alias stands for.
func (w *apiWalker) typ(t types.Type, where string, aliasOK bool) {
	switch x := t.(type) {
	case *types.Alias:
		w.typ(types.Unalias(x), where, true) // named publicly here: what it stands for may be internal
	case *types.Named:
		obj := x.Obj()
		if obj.Pkg() == nil || !obj.Exported() { // error, comparable; an unexported type in an exported field is Go's own pattern
			return
		}
		for a := range x.TypeArgs().Types() {
			w.typ(a, where, aliasOK)
		}
		path := obj.Pkg().Path()
		if !strings.HasPrefix(path, module) { // another module's type: its own API
			return
		}
		if isInternal(path) {
			if _, ok := w.aliased[obj]; !ok || !aliasOK {
				w.problem(where, x, ok)
			}
		}
		w.members(x.Origin(), path+"."+obj.Name())
	case *types.Pointer:
		w.typ(x.Elem(), where, aliasOK)
	case *types.Slice:
		w.typ(x.Elem(), where, aliasOK)
	case *types.Array:
		w.typ(x.Elem(), where, aliasOK)
	case *types.Chan:
		w.typ(x.Elem(), where, aliasOK)
	case *types.Map:
		w.typ(x.Key(), where, aliasOK)
		w.typ(x.Elem(), where, aliasOK)
	case *types.Signature:
		w.typ(x.Params(), where, aliasOK)
		w.typ(x.Results(), where, aliasOK)
	case *types.Tuple:
		for v := range x.Variables() {
			w.typ(v.Type(), where, aliasOK)
		}
	case *types.Struct:
		for f := range x.Fields() {
			if f.Exported() || f.Embedded() {
				w.typ(f.Type(), where+"."+f.Name(), aliasOK)
			}
		}
	case *types.Interface:
		for m := range x.Methods() {
			if m.Exported() {
				w.typ(m.Type(), where+"."+m.Name(), aliasOK)
			}
		}
		for e := range x.EmbeddedTypes() {
			w.typ(e, where, aliasOK)
		}
	}
}

func (w *apiWalker) problem(where string, n *types.Named, aliased bool) {
	p := fmt.Sprintf("%s names %s.%s", where, n.Obj().Pkg().Path(), n.Obj().Name())
	if aliased {
		p += " by its internal name: write " + w.aliased[n.Obj()]
	} else {
		p += ", which no public package names"
	}
	if !slices.Contains(w.problems, p) {
		w.problems = append(w.problems, p)
	}
}
