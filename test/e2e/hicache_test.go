package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hicacheArgs give a pool too small to keep more than a prompt or two, an
// L2 of a few pages and an L3 of files under dir.
func hicacheArgs(dir string) []string {
	return []string{"--page-size", "4", "--max-total-tokens", "160", "--hicache-size", "0.01",
		"--hicache-storage-backend", "file", "--hicache-storage-dir", dir, "--kv-poison"}
}

// The third tier outlives the process: a server restarted over the same
// directory answers a prompt it cached before from L3 (counted as l3
// hits), the same as computing it; another tenant finds nothing there;
// and page files damaged on disk are misses, never
// wrong output. (Files of another model, layout or dtype: filestore's tests.)
func TestHiCacheL3SurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":12,"temperature":0,"logprobs":5}`, prefixPrompt)

	s := startServer(t, hicacheArgs(dir)...)
	first := askCached(t, s.URL, "/v1/completions", body, "key-a")
	if first.cached(t) != 0 {
		t.Fatalf("a fresh directory gave %d cached tokens", first.cached(t))
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	files := pageFiles(t, dir)
	if len(files) == 0 {
		t.Fatal("the first server left no page files in the L3 directory")
	}

	s = startServer(t, hicacheArgs(dir)...)
	other := askCached(t, s.URL, "/v1/completions", body, "key-b")
	if other.cached(t) != 0 {
		t.Fatalf("another tenant read %d cached tokens from the first tenant's files", other.cached(t))
	}
	sameTop(t, "another tenant", other, first)
	again := askCached(t, s.URL, "/v1/completions", body, "key-a")
	if want := (first.Usage.PromptTokens - 1) / 4 * 4; again.cached(t) != want {
		t.Fatalf("after a restart the same tenant read %d cached tokens, want %d", again.cached(t), want)
	}
	sameTop(t, "from L3 after a restart", again, first)
	m := metricsOf(t, s)
	if m[`baton_hicache_hit_pages_total{role="standalone",tier="l3"}`] == 0 {
		t.Fatalf("no l3 hits counted after a restart: %v", hicacheFigures(m))
	}
	if m["baton_kv_read_before_ready_total"] != 0 {
		t.Fatalf("the read gate refused %v pages on the normal path", m["baton_kv_read_before_ready_total"])
	}
	waitPagesFree(t, s)
	if err := s.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// Flip a byte in the middle of every page file: each is now a miss
	// (the store's payload checksum), and the answer is the computed one.
	for _, f := range pageFiles(t, dir) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)-len(b)/4] ^= 0x40
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s = startServer(t, hicacheArgs(dir)...)
	damaged := askCached(t, s.URL, "/v1/completions", body, "key-a")
	if damaged.cached(t) != 0 {
		t.Fatalf("damaged page files gave %d cached tokens", damaged.cached(t))
	}
	sameTop(t, "damaged L3", damaged, first)
	// The index still names the files (Open reads headers only), so they
	// are found, and their loads end as misses.
	if m := metricsOf(t, s); m["baton_hicache_load_failures_total"] == 0 || m["baton_hicache_loaded_bytes_total"] != 0 {
		t.Fatalf("damaged files loaded: %v", hicacheFigures(m))
	}
}

func pageFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".kv") {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hicacheFigures(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "baton_hicache_") {
			out[k] = v
		}
	}
	return out
}
