package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const doc = "ARCHITECTURE.md"

// root is the repository root, seen from this package's directory.
const root = ".."

var (
	// `path/file.go:Name` or `path/file.go:Type.Method`.
	fileRef = regexp.MustCompile(`([A-Za-z0-9_./-]+\.go):([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)`)
	// A backticked span.
	code = regexp.MustCompile("`([^`\n]+)`")
	// A bare `Type.Method` or `pkg.Name`.
	bareRef = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$`)
	// A lifecycle table row: | role | From → To |
	moveRow = regexp.MustCompile(`(?m)^\| (standalone|prefill|decode) \| ([A-Za-z]+) → ([A-Za-z]+) \|`)
)

// The document's own examples of the reference forms.
var examples = map[string]bool{"path/file.go": true, "Type.Method": true}

// Top-level folders a path in the document may start with.
var repoDirs = []string{"api/", "cmd/", "deploy/", "docs/", "internal/", "test/"}

// Suffixes of a backticked a.b that names a file, not a declaration.
var fileSuffixes = map[string]bool{"md": true, "go": true, "proto": true, "sh": true, "mk": true, "yaml": true, "json": true, "mjs": true}

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// decls are the names a Go file declares at top level: funcs, types, vars,
// consts, and methods as Type.Method.
func decls(t *testing.T, path string) (map[string]bool, string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	names := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv != nil && len(d.Recv.List) == 1 {
				names[recvName(d.Recv.List[0].Type)+"."+d.Name.Name] = true
			} else {
				names[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					names[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
	return names, f.Name.Name
}

func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// TestFileReferences: every path/file.go:Name in the document names a file
// that exists and declares Name.
func TestFileReferences(t *testing.T) {
	text := readDoc(t)
	refs := fileRef.FindAllStringSubmatch(text, -1)
	if len(refs) < 50 {
		t.Fatalf("only %d path/file.go:Name references found; the pattern or the document changed", len(refs))
	}
	cache := map[string]map[string]bool{}
	for _, m := range refs {
		file, name := m[1], m[2]
		if examples[file] {
			continue
		}
		names, ok := cache[file]
		if !ok {
			p := filepath.Join(root, filepath.FromSlash(file))
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s:%s: %v", file, name, err)
				cache[file] = nil
				continue
			}
			names, _ = decls(t, p)
			cache[file] = names
		}
		if names != nil && !names[name] {
			t.Errorf("%s does not declare %s", file, name)
		}
	}
}

// TestPaths: every backticked path into the repository exists.
func TestPaths(t *testing.T) {
	for _, m := range code.FindAllStringSubmatch(readDoc(t), -1) {
		s := m[1]
		if i := strings.IndexByte(s, ':'); i > 0 && strings.HasSuffix(s[:i], ".go") {
			continue // checked by TestFileReferences
		}
		for _, d := range repoDirs {
			if strings.HasPrefix(s, d) && !strings.ContainsAny(s, " *{<") {
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(s))); err != nil {
					t.Errorf("`%s`: %v", s, err)
				}
			}
		}
	}
}

// TestBareReferences: every backticked Type.Method or pkg.Name without a
// file is declared somewhere in the module: a method of that type, or a
// top-level name in a package of that name.
func TestBareReferences(t *testing.T) {
	methods, pkgNames := map[string]bool{}, map[string]bool{}
	for _, top := range repoDirs {
		dir := filepath.Join(root, top)
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") {
				return nil
			}
			names, pkg := decls(t, p)
			for n := range names {
				if strings.Contains(n, ".") {
					methods[n] = true
				} else {
					pkgNames[pkg+"."+n] = true
				}
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	for _, m := range code.FindAllStringSubmatch(readDoc(t), -1) {
		b := bareRef.FindStringSubmatch(m[1])
		if b == nil || fileSuffixes[b[2]] || examples[m[1]] {
			continue
		}
		if !methods[m[1]] && !pkgNames[m[1]] {
			t.Errorf("`%s`: no such method or package-level name in the module", m[1])
		}
	}
}

// TestLifecycleTable: the document's table of moves is exactly the
// scheduler's moves table, role by role.
func TestLifecycleTable(t *testing.T) {
	path := filepath.Join(root, "internal", "scheduler", "lifecycle.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]string{"RoleStandalone": "standalone", "RolePrefill": "prefill", "RoleDecode": "decode"}
	state := func(e ast.Expr) string {
		id, ok := e.(*ast.Ident)
		if !ok || !strings.HasPrefix(id.Name, "State") {
			t.Fatalf("lifecycle.go: moves holds %T, not a State constant", e)
		}
		return strings.TrimPrefix(id.Name, "State")
	}
	code := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "moves" || len(vs.Values) != 1 {
			return true
		}
		for _, el := range vs.Values[0].(*ast.CompositeLit).Elts {
			kv := el.(*ast.KeyValueExpr)
			role := roles[kv.Key.(*ast.Ident).Name]
			if role == "" {
				t.Fatalf("lifecycle.go: unknown role %v in moves", kv.Key)
			}
			for _, mv := range kv.Value.(*ast.CompositeLit).Elts {
				pair := mv.(*ast.CompositeLit).Elts
				code[role+" "+state(pair[0])+" → "+state(pair[1])] = true
			}
		}
		return false
	})
	if len(code) == 0 {
		t.Fatal("lifecycle.go: no moves table found")
	}
	docMoves := map[string]bool{}
	for _, m := range moveRow.FindAllStringSubmatch(readDoc(t), -1) {
		k := m[1] + " " + m[2] + " → " + m[3]
		if docMoves[k] {
			t.Errorf("%s: move listed twice: %s", doc, k)
		}
		docMoves[k] = true
	}
	var missing, extra []string
	for k := range code {
		if !docMoves[k] {
			missing = append(missing, k)
		}
	}
	for k := range docMoves {
		if !code[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	for _, k := range missing {
		t.Errorf("%s: move %s is in lifecycle.go's moves but not in the table", doc, k)
	}
	for _, k := range extra {
		t.Errorf("%s: move %s is in the table but not in lifecycle.go's moves", doc, k)
	}
}
