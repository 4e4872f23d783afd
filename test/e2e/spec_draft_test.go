package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Standalone and a PD decode worker drafting with a draft model (the
// Hugging Face copy of the bundled model): the greedy reference comes out
// token for token, drafts were verified, and every page comes back. The
// prefill worker of the pair is given the same flags (one set of worker
// arguments) and drafts nothing.
func TestDraftModelSpeculativeGreedy(t *testing.T) {
	ref := loadReference(t)
	draft := []string{"--speculative-algorithm", "draft", "--speculative-draft-model-path", storiesHFDir(t), "--speculative-num-draft-tokens", "3", "--speculative-num-steps", "3"}
	s := startServer(t, append([]string{"--kv-poison", "--page-size", "4"}, draft...)...)
	greedyConcurrently(t, s.URL, ref, 4)
	waitPagesFree(t, s)
	m := metricsOf(t, s)
	if m["baton_spec_draft_tokens_total"] == 0 || m["baton_spec_accepted_tokens_total"] == 0 || m["baton_kv_read_gate_failures_total"] != 0 {
		t.Fatalf("standalone spec metrics: drafted %v accepted %v read gate failures %v", m["baton_spec_draft_tokens_total"],
			m["baton_spec_accepted_tokens_total"], m["baton_kv_read_gate_failures_total"])
	}
	c := startCluster(t, 1, 1, draft, nil)
	greedyConcurrently(t, c.Router.URL, ref, 4)
	c.WaitClean(t)
	if m := metricsOf(t, c.Decode[0]); m["baton_spec_draft_tokens_total"] == 0 {
		t.Fatalf("the decode worker drafted nothing")
	}
	if m := metricsOf(t, c.Prefill[0]); m["baton_spec_draft_tokens_total"] != 0 {
		t.Fatalf("the prefill worker drafted %v tokens", m["baton_spec_draft_tokens_total"])
	}
}

// A draft whose tokenizer is not the model's is refused at start-up,
// naming the difference.
func TestDraftModelWithAnotherTokenizerIsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := copyHFWithConfig(t, dir); err != nil {
		t.Fatal(err)
	}
	out, err := runCommand(context.Background(), 60*time.Second, repoRoot(t), cleanEnv(), batonBinary(t), "serve", "--port", "0",
		"--speculative-algorithm", "draft", "--speculative-draft-model-path", dir, "--speculative-draft-load-format", "dummy")
	if err == nil || !strings.Contains(out, "the draft's tokenizer has") {
		t.Fatalf("serve with a draft of another tokenizer: %v\n%s", err, out)
	}
}

// copyHFWithConfig makes a dummy model directory: stories260K's config
// next to the Qwen3 tokenizer.
func copyHFWithConfig(t *testing.T, dir string) error {
	t.Helper()
	for _, f := range []struct{ from, name string }{
		{filepath.Join(repoRoot(t), "testdata", "tokenizers", "qwen3"), "tokenizer.json"},
		{filepath.Join(repoRoot(t), "testdata", "tokenizers", "qwen3"), "tokenizer_config.json"},
		{storiesHFDir(t), "config.json"},
	} {
		b, err := os.ReadFile(filepath.Join(f.from, f.name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
