package roles

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/model/synth"
)

// A mixture of experts handed off from prefill to decode gives the tokens
// it gives standalone: the handoff moves attention KV only, and the
// experts each row runs are chosen again from its own activations.
func TestHandoffMoEEqualsStandalone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "moe.gguf")
	s := synth.Shape{Vocab: 600, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FF: 32, Context: 512, DType: "F16", Arch: "qwen3moe", Experts: 8, ExpertsUsed: 2}
	if err := synth.Write(path, s, synth.Options{Seed: 4, Std: 0.3}); err != nil {
		t.Fatal(err)
	}
	l, err := model.Load(model.LoadOptions{Path: path}, cpu.New(1))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Model.Close()
	want := reference{PromptIDs: []int32{1, 34, 200, 17, 99, 5, 310, 42, 8, 77, 3}}
	got, err := l.Model.GreedyDecode(want.PromptIDs, 10, 16, 512, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range got {
		want.GeneratedIDs = append(want.GeneratedIDs, g.ID)
	}
	testModelPath = path
	defer func() { testModelPath = "" }()
	for _, tc := range []struct{ page, chunk int }{{16, 512}, {2, 3}} {
		handoffsMatch(t, newPair(t, tc.page, tc.chunk), want, 4, fmt.Sprintf("moe page %d chunk %d", tc.page, tc.chunk))
	}
}
