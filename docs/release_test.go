package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var releaseHeading = regexp.MustCompile(`(?m)^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$`)

// The changelog opens with Unreleased, then releases newest first, each
// dated; it states the deprecation policy, and the README says the same.
func TestChangelog(t *testing.T) {
	text := readRepo(t, "CHANGELOG.md")
	hs := releaseHeading.FindAllStringSubmatch(text, -1)
	if len(hs) < 2 || hs[0][1] != "Unreleased" {
		t.Fatalf("CHANGELOG.md must start its releases with ## [Unreleased], then ## [X.Y.Z] - YYYY-MM-DD; found %v", hs)
	}
	for _, h := range hs[1:] {
		if h[2] == "" {
			t.Errorf("release %s has no date", h[1])
		}
		if !strings.Contains(text, "\n["+h[1]+"]: ") {
			t.Errorf("release %s has no link reference at the end", h[1])
		}
	}
	const policy = "keeps working"
	for _, f := range []string{"CHANGELOG.md", "README.md"} {
		s := readRepo(t, f)
		if !strings.Contains(s, "deprecated in release N") || !strings.Contains(s, policy) || !strings.Contains(s, "removed in release N+2") {
			t.Errorf("%s does not state the deprecation policy (deprecated in release N %s through N+1, removed in release N+2)", f, policy)
		}
	}
	if strings.Contains(readRepo(t, "README.md"), "kept one release") {
		t.Error("README.md says a deprecated name is \"kept one release\"; the policy keeps it through the next release")
	}
}

// `make release` tags only a clean tree whose changelog has the version,
// and the tag carries that version's section. Run in a scratch repository
// holding the makefile and changelog, so nothing here is tagged.
func TestReleaseTarget(t *testing.T) {
	for _, tool := range []string{"make", "git", "awk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip("no " + tool)
		}
	}
	dir := t.TempDir()
	for _, f := range []string{"CHANGELOG.md", "deploy/dist.mk"} {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t",
		"GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "MAKEFLAGS=")
	run := func(name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	must := func(name string, args ...string) string {
		t.Helper()
		out, err := run(name, args...)
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return out
	}
	must("git", "init", "-q")
	must("git", "add", ".")
	must("git", "commit", "-q", "-m", "x")
	release := func(args ...string) (string, error) {
		return run("make", append([]string{"-s", "-f", "deploy/dist.mk", "release"}, args...)...)
	}

	if out, err := release(); err == nil {
		t.Errorf("make release with no VERSION tagged:\n%s", out)
	}
	if out, err := release("VERSION=v9.9.9"); err == nil || !strings.Contains(out, "CHANGELOG.md has no dated section") {
		t.Errorf("a version the changelog lacks: err %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "stray"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := release("VERSION=v0.1.0"); err == nil || !strings.Contains(out, "not committed") {
		t.Errorf("a dirty tree: err %v\n%s", err, out)
	}
	if err := os.Remove(filepath.Join(dir, "stray")); err != nil {
		t.Fatal(err)
	}
	if out, err := release("VERSION=v0.1.0"); err != nil {
		t.Fatalf("make release VERSION=v0.1.0: %v\n%s", err, out)
	}
	msg := must("git", "tag", "-l", "--format=%(contents)", "v0.1.0")
	if !strings.HasPrefix(msg, "baton [0.1.0] - ") || !strings.Contains(msg, "### Added") || strings.Contains(msg, "Unreleased") {
		t.Errorf("the tag's message is not the 0.1.0 section:\n%s", msg)
	}
	if out, err := release("VERSION=v0.1.0"); err == nil || !strings.Contains(out, "exists") {
		t.Errorf("tagging twice: err %v\n%s", err, out)
	}
}
