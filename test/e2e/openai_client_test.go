package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// bundledModel is the served name of the model baton embeds and serves when
// started without --model.
const bundledModel = "stories260K"

// TestOpenAINodeClient runs test/openai/client.mjs, which uses the official
// openai npm package against a live server. A missing Node.js fails the test
// instead of skipping it: a skip would let an OpenAI-compatibility regression
// pass CI unnoticed, and CI installs Node.js.
func TestOpenAINodeClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found in PATH; install Node.js and npm (.ci/run does) to run the OpenAI client test")
	}
	root := repoRoot(t)
	dir := filepath.Join(root, "test", "openai")
	env := cleanEnv()
	if stale, why := nodeModulesStale(dir); stale {
		npm, err := exec.LookPath("npm")
		if err != nil {
			t.Fatalf("npm not found in PATH and test/openai needs installing (%s)", why)
		}
		t.Logf("npm ci in test/openai: %s", why)
		if _, err := runCommand(t.Context(), 5*time.Minute, dir, env, npm, "ci", "--no-audit", "--no-fund"); err != nil {
			t.Fatal(err)
		}
	}

	// The tool checks need a tool-call parser; TestPDOpenAINodeClient runs
	// the same checks through router, prefill and decode.
	s := startServer(t, "--tool-call-parser", "hermes")
	out, err := runCommand(t.Context(), 2*time.Minute, root, env, node, filepath.Join("test", "openai", "client.mjs"), s.URL, bundledModel)
	if err != nil {
		t.Fatalf("OpenAI client checks failed: %v\nserver stderr:\n%s", err, s.Stderr())
	}
	t.Log(out)
}

// nodeModulesStale reports whether test/openai needs `npm ci`: when
// node_modules misses a dependency, or holds another version than
// package.json pins, which happens after a version bump in an existing
// checkout.
func nodeModulesStale(dir string) (bool, string) {
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := readJSON(filepath.Join(dir, "package.json"), &pkg); err != nil {
		return true, err.Error()
	}
	for name, want := range pkg.Dependencies {
		var installed struct {
			Version string `json:"version"`
		}
		if err := readJSON(filepath.Join(dir, "node_modules", name, "package.json"), &installed); err != nil {
			return true, "node_modules/" + name + " is missing"
		}
		if installed.Version != want {
			return true, "node_modules has " + name + " " + installed.Version + ", package.json pins " + want
		}
	}
	return false, ""
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
