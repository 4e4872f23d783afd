// Package local holds what runs baton on one machine: make run's script
// and the check of what the machine needs for make run and make test.
package local

import (
	"os"
	"os/exec"
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
