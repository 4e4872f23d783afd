package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// baton model synth writes a file baton model inspect loads, with the
// shape asked for: a benchmark shape made tiny through the size flags.
func TestModelSynthCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		root := rootCmd()
		root.SetOut(&out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("baton %v: %v", args, err)
		}
		return out.String()
	}
	out := run("model", "synth", "--shape", "1.1b", "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
		"--ffn", "96", "--vocab-size", "600", "--seed", "3", path)
	if !strings.Contains(out, "wrote "+path) || !strings.Contains(out, "F16") {
		t.Errorf("synth said %q", out)
	}
	out = run("model", "inspect", path)
	for _, want := range []string{"shape:           vocab 600, hidden 64, layers 2, heads 4, kv heads 2, head dim 16, ffn 96",
		"context length:  2048", "loads:           yes", "F16"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
	root := rootCmd()
	root.SetArgs([]string{"model", "synth", "--shape", "7b", path})
	root.SetOut(&bytes.Buffer{})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "134m") {
		t.Errorf("an unknown shape: %v", err)
	}
}
