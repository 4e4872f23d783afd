package docs

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const (
	module       = "github.com/batonlm/baton/"
	importsIntro = "Non-test imports inside the module"
)

// importLines are the packages' in-module imports as the document writes
// them: one line a package, "pkg → a, b" (paths without "internal/"), or
// "pkg → (nothing)"; the packages and each list sorted.
func importLines(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}: {{join .Imports " "}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	short := func(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "internal/") }
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(l, ": ")
		var in []string
		for _, imp := range strings.Fields(imports) {
			if strings.HasPrefix(imp, module) {
				in = append(in, short(imp))
			}
		}
		slices.Sort(in)
		list := "(nothing)"
		if len(in) > 0 {
			list = strings.Join(in, ", ")
		}
		lines = append(lines, short(pkg)+" → "+list)
	}
	slices.Sort(lines)
	return lines
}

// documentedImports are the lines of the fenced block after importsIntro.
func documentedImports(t *testing.T) []string {
	t.Helper()
	doc := readDoc(t)
	i := strings.Index(doc, importsIntro)
	if i < 0 {
		t.Fatalf("no %q section", importsIntro)
	}
	start := strings.Index(doc[i:], "```\n")
	end := strings.Index(doc[i+start+4:], "```")
	if start < 0 || end < 0 {
		t.Fatal("the import list is not in a fenced block")
	}
	var lines []string
	for _, l := range strings.Split(doc[i+start+4:i+start+4+end], "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestImportList: the document's import list is the module's, line for
// line, so the arrows it draws cannot drift from the code.
func TestImportList(t *testing.T) {
	want, got := importLines(t), documentedImports(t)
	for _, l := range want {
		if !slices.Contains(got, l) {
			t.Errorf("missing or different in the document: %s", l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			t.Errorf("in the document but not the code: %s", l)
		}
	}
	if t.Failed() {
		t.Logf("the whole list, as go list gives it today:\n%s", strings.Join(want, "\n"))
	}
}
