package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// A binary built without -ldflags (plain `go build`) names its commit from
// the toolchain's record, and says when the checkout was modified.
func TestResolveBuildFallback(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "35c97da4f1b2c3d4e5f60718293a4b5c6d7e8f90"},
		{Key: "vcs.time", Value: "2026-12-04T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	got := resolveBuild("", "", "", bi)
	want := buildInfo{Version: "dev", Commit: "35c97da4f1b2", Committed: "2026-12-04T10:00:00Z", Modified: true}
	if got != want {
		t.Fatalf("resolveBuild = %+v, want %+v", got, want)
	}
	if s := got.String(); s != "baton dev (commit 35c97da4f1b2, modified, committed 2026-12-04T10:00:00Z)" {
		t.Errorf("String() = %q", s)
	}

	// go install module@v0.1.0 records the tag as the main module's version.
	bi.Main.Version = "v0.1.0"
	if got := resolveBuild("", "", "", bi); got.Version != "v0.1.0" {
		t.Errorf("version from the build record = %q, want v0.1.0", got.Version)
	}
	// Link-time values win over the record, and are not mixed with it.
	got = resolveBuild("v0.2.0", "abc1234", "2026-12-05T00:00:00Z", bi)
	want = buildInfo{Version: "v0.2.0", Commit: "abc1234", Date: "2026-12-05T00:00:00Z"}
	if got != want {
		t.Errorf("with ldflags: %+v, want %+v", got, want)
	}
	// Nothing known at all (no record, no ldflags).
	if s := resolveBuild("", "", "", nil).String(); s != "baton dev" {
		t.Errorf("no build info: %q", s)
	}
}

// The binary `make build` makes names the checkout's commit and the
// Makefile's version (git describe) in `baton version`.
func TestMakeBuildVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip("no " + tool)
		}
	}
	rootDir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	head, err := exec.Command("git", "-C", rootDir, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	describe, err := exec.Command("git", "-C", rootDir, "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "baton")
	build := exec.Command("make", "-C", rootDir, "--no-print-directory", "build", "BIN="+bin)
	build.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSpace(string(out))
	for _, want := range []string{"baton " + strings.TrimSpace(string(describe)) + " ", "commit " + strings.TrimSpace(string(head)), "built 20"} {
		if !strings.Contains(s, want) {
			t.Errorf("baton version = %q, want it to contain %q", s, want)
		}
	}
}
