package copymodel

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/bench"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/tokenizer"
)

// The loaded model, greedy, repeats a text of random words it was asked
// to echo: the construction survives the loader's layout (q/k order, RoPE
// pairing and sign, norms, attention scale). Two layers of the 134M
// model's width keep it quick; the other layers of the benchmark shapes
// add zero.
func TestEchoesText(t *testing.T) {
	f, err := gguf.Open("../../../testdata/vocab/ggml-vocab-llama-spm.gguf")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := Shape134M
	s.Layers, s.FF = 2, 64
	if err := Write(dir, s, 1); err != nil {
		t.Fatal(err)
	}
	l, err := model.Load(model.LoadOptions{Path: dir}, cpu.New(2))
	if err != nil {
		t.Fatal(err)
	}
	text := bench.Prompt(rand.New(rand.NewPCG(3, 4)), 60)
	lead := strings.Join(strings.Fields(text)[:8], " ")
	textIDs := tok.Encode(text, true, false)
	prompt := tok.Encode(text+"\n\nRepeat the text above exactly, word for word:\n\n"+lead, true, false)
	// The repeat goes on with the text's tokens after its first 8 words.
	want := textIDs[len(tok.Encode(lead, true, false)):]
	want = want[:min(len(want), 100)]
	got, err := l.Model.GreedyDecode(prompt, len(want), 16, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	var gotIDs []int32
	for i, g := range got {
		gotIDs = append(gotIDs, g.ID)
		if g.ID == want[i] {
			same++
		}
	}
	t.Logf("%d of %d tokens as the text\n got: %q\nwant: %q", same, len(want), tok.Decode(gotIDs), tok.Decode(want))
	if same*10 < len(want)*9 {
		t.Fatalf("the model echoed %d of %d tokens, want at least 90%%", same, len(want))
	}
}
