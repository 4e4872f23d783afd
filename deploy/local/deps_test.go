// Package local holds what runs baton on one machine: make run's script
// and the check of what the machine needs for make run and make test.
package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func deps(t *testing.T, what string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("./deps.sh", what)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// On a machine where make test runs, deps.sh finds everything for both
// targets and installs nothing; with a check made to fail and installing
// off, it fails naming the one command that fixes it, with exactly the
// packages missing.
func TestDeps(t *testing.T) {
	for _, what := range []string{"run", "test"} {
		if out, err := deps(t, what, "BATON_DEPS_NO_INSTALL=1"); err != nil || out != "" {
			t.Errorf("deps.sh %s on this machine: %v %q", what, err, out)
		}
	}
	out, err := deps(t, "test", "BATON_DEPS_NO_INSTALL=1", "BATON_DEPS_PRETEND_MISSING=openblas promtool")
	if err == nil {
		t.Fatal("deps.sh passed with packages missing")
	}
	if !strings.Contains(out, "apt-get install -y --no-install-recommends libopenblas-dev prometheus\n") {
		t.Errorf("deps.sh did not give the one command to run: %q", out)
	}
	// make run needs less than make test.
	if out, err := deps(t, "run", "BATON_DEPS_NO_INSTALL=1", "BATON_DEPS_PRETEND_MISSING=promtool ucx node"); err != nil {
		t.Errorf("make run asked for what only make test needs: %v %q", err, out)
	}
	if _, err := deps(t, "nonsense"); err == nil {
		t.Error("deps.sh took an unknown target")
	}
}

// fakeGo writes a go command that reports version v, for deps.sh's GO.
func fakeGo(t *testing.T, v string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "go")
	script := "#!/bin/sh\n[ \"$1 $2\" = \"env GOVERSION\" ] && echo " + v + " && exit 0\necho \"go version " + v + " linux/amd64\"\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// deps.sh checks what the README says it does: Go 1.26 or newer (which
// Debian does not package, so it says where to get it), make (Debian 12
// has none by default, and make run is how one starts) and
// ca-certificates (the first build downloads modules over HTTPS). Before,
// it checked none of the three.
func TestDepsGoMakeCerts(t *testing.T) {
	for _, v := range []string{"go1.26.0", "go1.26.8", "go1.27rc1", "go1.30"} {
		if out, err := deps(t, "run", "BATON_DEPS_NO_INSTALL=1", "GO="+fakeGo(t, v)); err != nil || out != "" {
			t.Errorf("%s: %v %q", v, err, out)
		}
	}
	for _, c := range []struct{ goCmd, found string }{
		{fakeGo(t, "go1.19.8"), "go1.19.8"},
		{fakeGo(t, "go1.25.9"), "go1.25.9"},
		{filepath.Join(t.TempDir(), "nothing"), "none"},
	} {
		for _, what := range []string{"run", "test"} {
			out, err := deps(t, what, "BATON_DEPS_NO_INSTALL=1", "GO="+c.goCmd)
			if err == nil || !strings.Contains(out, "Go 1.26 or newer") || !strings.Contains(out, "https://go.dev/dl/") || !strings.Contains(out, c.found) {
				t.Errorf("%s with %s: %v %q", what, c.found, err, out)
			}
			if strings.Contains(out, "apt-get") {
				t.Errorf("%s with %s asked for Debian packages, which have no Go 1.26: %q", what, c.found, out)
			}
		}
	}
	for _, what := range []string{"run", "test"} {
		out, err := deps(t, what, "BATON_DEPS_NO_INSTALL=1", "BATON_DEPS_PRETEND_MISSING=make certs")
		if err == nil || !strings.Contains(out, "apt-get install -y --no-install-recommends make ca-certificates\n") {
			t.Errorf("%s without make and ca-certificates: %v %q", what, err, out)
		}
	}
}
