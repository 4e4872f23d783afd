// Package reference loads the public greedy reference every correctness
// test compares against: llama.cpp's continuation of "Once upon a time" on
// the bundled stories260K (testdata/stories260K-greedy-once-upon-a-time.json).
package reference

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// Alt is one of the top-5 candidates at a generated position.
type Alt struct {
	ID      int32   `json:"id"`
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
}

// Greedy is the reference continuation.
type Greedy struct {
	Prompt        string  `json:"prompt"`
	PromptIDs     []int32 `json:"prompt_token_ids"`
	GeneratedIDs  []int32 `json:"generated_token_ids"`
	GeneratedText string  `json:"generated_text"`
	Top5          [][]Alt `json:"top5_logprobs_per_position"`
}

// Load reads the reference from the repository's testdata.
func Load(t testing.TB) Greedy {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.RepoRoot(t), "testdata", "stories260K-greedy-once-upon-a-time.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g Greedy
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}
