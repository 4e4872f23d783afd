package model

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model/hftest"
)

const storiesHF = "../../testdata/stories260K-hf"

// checkReference runs greedy decoding and compares tokens and top-5
// logprobs with the public llama.cpp reference.
func checkReference(t *testing.T, m *Model, pageSize, chunk int) {
	t.Helper()
	ref0 := loadReference(t)
	got, tops := generate(t, m, ref0.PromptIDs, len(ref0.GeneratedIDs), pageSize, chunk)
	for i := range got {
		if got[i] != ref0.GeneratedIDs[i] {
			t.Fatalf("token %d = %d, want %d (got %v)", i, got[i], ref0.GeneratedIDs[i], got)
		}
		for j, want := range ref0.Top5[i] {
			g := tops[i][j]
			if g.ID != want.ID || math.Abs(float64(g.Logprob)-want.Logprob) > 1e-3 {
				t.Fatalf("position %d top %d = %+v, want %+v", i, j, g, want)
			}
		}
	}
}

func TestHFStoriesGreedyMatchesGGUF(t *testing.T) {
	gg, err := Load(LoadOptions{}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	defer gg.Model.Close()
	for _, path := range []string{storiesHF, storiesHF + "/", filepath.Join(storiesHF, "config.json")} {
		l, err := Load(LoadOptions{Path: path}, ref.New())
		if err != nil {
			t.Fatal(err)
		}
		c := l.Model.Config
		if l.Dir == "" || l.GGUF != nil || l.Format != "safetensors" || l.Name != "stories260K-hf" {
			t.Fatalf("%s: Dir %q GGUF %v Format %q Name %q", path, l.Dir, l.GGUF != nil, l.Format, l.Name)
		}
		if !slices.Equal(l.Generation.EOS, []int32{2}) || l.Generation.Temperature != nil {
			t.Fatalf("generation config %+v", l.Generation)
		}
		g := gg.Model.Config
		if c.Vocab != g.Vocab || c.Dim != g.Dim || c.Layers != g.Layers || c.Heads != g.Heads || c.KVHeads != g.KVHeads ||
			c.HeadDim != g.HeadDim || c.FF != g.FF || c.ContextLength != g.ContextLength || c.RoPE.Theta != g.RoPE.Theta || !c.RoPE.NeoX {
			t.Fatalf("HF config %+v\nGGUF config %+v", c, g)
		}
		if l.Model.Weights.Params() != gg.Model.Weights.Params() {
			t.Fatalf("params %d vs %d", l.Model.Weights.Params(), gg.Model.Weights.Params())
		}
		// The same trained model must give the same tokens and logprobs.
		checkReference(t, l.Model, 16, 512)
		checkReference(t, l.Model, 1, 3)
		l.Model.Close()
	}
}

// The HF Q/K are in rotate-half order: read with adjacent-pair RoPE (as the
// GGUF is) the model must leave the reference, so the test above can fail.
func TestHFStoriesNeedsNeoXRoPE(t *testing.T) {
	l, err := Load(LoadOptions{Path: storiesHF}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Model.Close()
	l.Model.Config.RoPE.NeoX = false
	ref0 := loadReference(t)
	got, _ := generate(t, l.Model, ref0.PromptIDs, 16, 16, 512)
	if slices.Equal(got, ref0.GeneratedIDs[:16]) {
		t.Fatal("adjacent-pair RoPE on HF weights still matched the reference")
	}
}

// storiesTensors reads the fixture's tensors as float32.
func storiesTensors(t *testing.T) []hftest.Tensor {
	t.Helper()
	f, err := OpenSafetensors(filepath.Join(storiesHF, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []hftest.Tensor
	for _, ti := range f.Tensors {
		_, data, err := f.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		m := kernels.Matrix{DType: kernels.F32, Rows: 1, Cols: int(ti.Elements()), Data: data}
		vals := make([]float32, m.Cols)
		m.Row(0, vals)
		out = append(out, hftest.Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Vals: vals})
	}
	return out
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Sharded files with an index load to exactly the same model; BF16 and
// F16 copies stay in their dtype (not widened) and give nearly the same
// logits.
func TestHFShardedAndHalfPrecision(t *testing.T) {
	tensors := storiesTensors(t)
	base, err := Load(LoadOptions{Path: storiesHF}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	defer base.Model.Close()
	prompt := loadReference(t).PromptIDs
	want := lastLogits(t, base.Model, prompt)

	// Two shards, tensors split alternately, with an index.
	sharded := t.TempDir()
	copyFile(t, filepath.Join(storiesHF, "config.json"), filepath.Join(sharded, "config.json"))
	var parts [2][]hftest.Tensor
	wm := map[string]string{}
	for i, tn := range tensors {
		parts[i%2] = append(parts[i%2], tn)
		wm[tn.Name] = fmt.Sprintf("model-%05d-of-00002.safetensors", i%2+1)
	}
	for i, p := range parts {
		hftest.WriteSafetensors(t, filepath.Join(sharded, fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)), p, map[string]string{"format": "pt"})
	}
	idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": wm})
	if err := os.WriteFile(filepath.Join(sharded, "model.safetensors.index.json"), idx, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Load(LoadOptions{Path: sharded}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	if got := lastLogits(t, l.Model, prompt); !slices.Equal(got, want) {
		t.Fatal("sharded weights give other logits")
	}
	l.Model.Close()

	for _, dt := range []struct {
		name string
		kd   kernels.DType
		tol  float64
	}{{"BF16", kernels.BF16, 0.15}, {"F16", kernels.F16, 0.02}} {
		dir := t.TempDir()
		copyFile(t, filepath.Join(storiesHF, "config.json"), filepath.Join(dir, "config.json"))
		half := make([]hftest.Tensor, len(tensors))
		for i, tn := range tensors {
			tn.DType = dt.name
			half[i] = tn
		}
		hftest.WriteSafetensors(t, filepath.Join(dir, "model.safetensors"), half, nil)
		for _, be := range []kernels.Backend{ref.New(), cpu.New(2)} {
			l, err := Load(LoadOptions{Path: dir}, be)
			if err != nil {
				t.Fatal(err)
			}
			w := l.Model.Weights
			for _, m := range []*kernels.Matrix{w.Embed, w.Output, w.Layers[0].Q, w.Layers[4].Down} {
				if m.DType != dt.kd || len(m.Data) != m.Rows*m.Cols*2 {
					t.Fatalf("%s: matrix stored as %s with %d bytes", dt.name, m.DType, len(m.Data))
				}
			}
			got := lastLogits(t, l.Model, prompt)
			for i := range got {
				if d := math.Abs(float64(got[i] - want[i])); d > dt.tol {
					t.Fatalf("%s on %s: logit %d = %v, F32 gives %v", dt.name, be.Name(), i, got[i], want[i])
				}
			}
			l.Model.Close()
		}
	}
}

// lastLogits runs prompt in one batch and returns a copy of the logits of
// its last position.
func lastLogits(t *testing.T, m *Model, prompt []int32) []float32 {
	t.Helper()
	c := &m.Config
	kv := kernels.PagedKV{PageSize: 16, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
	np := (len(prompt) + 15) / 16
	kv.Data = make([]float32, np*kv.PageFloats())
	b := &Batch{}
	pages := make([]int32, np)
	for i := range pages {
		pages[i] = int32(i)
	}
	for p, tok := range prompt {
		b.Tokens = append(b.Tokens, tok)
		b.Positions = append(b.Positions, int32(p))
		b.Slots = append(b.Slots, int32(p))
	}
	b.Seqs = []kernels.AttnSeq{{Pages: pages, QLen: len(prompt), KVLen: len(prompt)}}
	logits, err := m.Forward(b, kv)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(logits[:c.Vocab])
}

// naiveLogits is an independent float64 forward pass of a Hugging Face
// Llama/Qwen2/Qwen3 model over tokens, written the way transformers
// computes it; it returns the last position's logits.
func naiveLogits(s hftest.Spec, eps, theta float64, w map[string][]float32, tokens []int32) []float64 {
	n, d := len(tokens), s.Dim
	qd, kvd, hd := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim, s.HeadDim
	matvec := func(name string, x []float64, rows int) []float64 {
		m, cols := w[name], len(x)
		out := make([]float64, rows)
		for r := range out {
			var acc float64
			for c, v := range x {
				acc += float64(m[r*cols+c]) * v
			}
			out[r] = acc
		}
		return out
	}
	rms := func(x []float64, weight []float32) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		sc := 1 / math.Sqrt(ss/float64(len(x))+eps)
		out := make([]float64, len(x))
		for i, v := range x {
			out[i] = v * sc * float64(weight[i])
		}
		return out
	}
	rope := func(x []float64, pos int) { // rotate_half over one head
		half := hd / 2
		for i := 0; i < half; i++ {
			ang := float64(pos) * math.Pow(theta, -2*float64(i)/float64(hd))
			sn, cs := math.Sincos(ang)
			a, b := x[i], x[i+half]
			x[i], x[i+half] = a*cs-b*sn, b*cs+a*sn
		}
	}
	xs := make([][]float64, n)
	for i, tok := range tokens {
		xs[i] = make([]float64, d)
		for j := range xs[i] {
			xs[i][j] = float64(w["model.embed_tokens.weight"][int(tok)*d+j])
		}
	}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		qs, ks, vs := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for i := range xs {
			h := rms(xs[i], w[p+"input_layernorm.weight"])
			qs[i], ks[i], vs[i] = matvec(p+"self_attn.q_proj.weight", h, qd), matvec(p+"self_attn.k_proj.weight", h, kvd), matvec(p+"self_attn.v_proj.weight", h, kvd)
			if s.QKVBias() {
				for j := range qs[i] {
					qs[i][j] += float64(w[p+"self_attn.q_proj.bias"][j])
				}
				for j := range ks[i] {
					ks[i][j] += float64(w[p+"self_attn.k_proj.bias"][j])
					vs[i][j] += float64(w[p+"self_attn.v_proj.bias"][j])
				}
			}
			for hh := 0; hh < s.Heads; hh++ {
				q := qs[i][hh*hd : (hh+1)*hd]
				if s.QKNorm() {
					copy(q, rms(q, w[p+"self_attn.q_norm.weight"]))
				}
				rope(q, i)
			}
			for hh := 0; hh < s.KVHeads; hh++ {
				k := ks[i][hh*hd : (hh+1)*hd]
				if s.QKNorm() {
					copy(k, rms(k, w[p+"self_attn.k_norm.weight"]))
				}
				rope(k, i)
			}
		}
		for i := range xs {
			attn := make([]float64, qd)
			for hh := 0; hh < s.Heads; hh++ {
				kvh := hh / (s.Heads / s.KVHeads)
				q := qs[i][hh*hd : (hh+1)*hd]
				scores := make([]float64, i+1)
				maxs := math.Inf(-1)
				for j := 0; j <= i; j++ {
					var dot float64
					for e := 0; e < hd; e++ {
						dot += q[e] * ks[j][kvh*hd+e]
					}
					scores[j] = dot / math.Sqrt(float64(hd))
					maxs = math.Max(maxs, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - maxs)
					sum += scores[j]
				}
				for j := range scores {
					for e := 0; e < hd; e++ {
						attn[hh*hd+e] += scores[j] / sum * vs[j][kvh*hd+e]
					}
				}
			}
			o := matvec(p+"self_attn.o_proj.weight", attn, d)
			for j := range xs[i] {
				xs[i][j] += o[j]
			}
			h := rms(xs[i], w[p+"post_attention_layernorm.weight"])
			ffn := func(gate, up, down string) []float64 {
				g, u := matvec(gate, h, s.FF), matvec(up, h, s.FF)
				for j := range g {
					g[j] = g[j] / (1 + math.Exp(-g[j])) * u[j]
				}
				return matvec(down, g, d)
			}
			if s.Experts == 0 {
				down := ffn(p+"mlp.gate_proj.weight", p+"mlp.up_proj.weight", p+"mlp.down_proj.weight")
				for j := range xs[i] {
					xs[i][j] += down[j]
				}
				continue
			}
			// transformers' sparse MoE block: softmax over the router's
			// logits, the top k (the lower index first among equals), the
			// chosen renormalised (Mixtral; Qwen3-MoE with norm_topk_prob).
			probs := matvec(s.Router(l), h, s.Experts)
			top := slices.Max(probs)
			var sum float64
			for e := range probs {
				probs[e] = math.Exp(probs[e] - top)
				sum += probs[e]
			}
			for e := range probs {
				probs[e] /= sum
			}
			order := make([]int, s.Experts)
			for e := range order {
				order[e] = e
			}
			slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(probs[b], probs[a]) })
			chosen := order[:s.ExpertsUsed]
			var norm float64 = 1
			if s.Arch == "MixtralForCausalLM" || s.NormTopK {
				norm = 0
				for _, e := range chosen {
					norm += probs[e]
				}
			}
			for _, e := range chosen {
				down := ffn(s.Expert(l, e, "gate"), s.Expert(l, e, "up"), s.Expert(l, e, "down"))
				for j := range xs[i] {
					xs[i][j] += probs[e] / norm * down[j]
				}
			}
		}
	}
	h := rms(xs[n-1], w["model.norm.weight"])
	out := "lm_head.weight"
	if s.Tie {
		out = "model.embed_tokens.weight"
	}
	return matvec(out, h, s.Vocab)
}

// maxDiff is the largest |a-b| relative to the largest |b|.
func maxDiff(a []float32, b []float64) float64 {
	var worst, scale float64
	for i := range b {
		worst = math.Max(worst, math.Abs(float64(a[i])-b[i]))
		scale = math.Max(scale, math.Abs(b[i]))
	}
	return worst / math.Max(scale, 1e-9)
}

var qwen3Spec = hftest.Spec{Arch: "Qwen3ForCausalLM", Vocab: 151936, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 128, Tie: true, DType: "BF16"}

// A Qwen3-shaped directory (BF16, tied embeddings, head_dim 32 with
// heads*head_dim != hidden, per-head q/k norms) loads in place and its
// forward pass agrees with an independent float64 one; without the q/k
// norms it would not.
func TestHFQwen3Shaped(t *testing.T) {
	dir := t.TempDir()
	vals := hftest.Write(t, dir, qwen3Spec, 1)
	hftest.WriteJSON(t, filepath.Join(dir, "generation_config.json"), map[string]any{
		"bos_token_id": 151643, "do_sample": true, "eos_token_id": []int{151645, 151643}, "pad_token_id": 151643,
		"temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"})
	prompt := []int32{151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198}
	want := naiveLogits(qwen3Spec, 1e-6, 1e6, vals, prompt)
	for _, be := range []kernels.Backend{ref.New(), cpu.New(2)} {
		l, err := Load(LoadOptions{Path: dir}, be)
		if err != nil {
			t.Fatal(err)
		}
		c, w := l.Model.Config, l.Model.Weights
		if c.Arch != "qwen3" || !c.QKNorm || c.QKVBias || !c.RoPE.NeoX || c.HeadDim != 32 || c.RoPE.Dim != 32 || c.ContextLength != 4096 || c.RoPE.Theta != 1e6 {
			t.Fatalf("config %+v", c)
		}
		if w.Output != w.Embed || w.DType() != kernels.BF16 || len(w.Embed.Data) != 151936*64*2 || len(w.Layers[1].KNorm) != 32 {
			t.Fatalf("weights: tied %v dtype %s", w.Output == w.Embed, w.DType())
		}
		g := l.Generation
		if !slices.Equal(g.EOS, []int32{151645, 151643}) || *g.Temperature != 0.6 || *g.TopP != 0.95 || *g.TopK != 20 || !*g.DoSample || *g.BOS != 151643 {
			t.Fatalf("generation config %+v", g)
		}
		got := lastLogits(t, l.Model, prompt)
		if d := maxDiff(got, want); d > 2e-4 {
			t.Fatalf("%s: logits differ from the float64 reference by %.2g", be.Name(), d)
		}
		for i := range w.Layers {
			w.Layers[i].QNorm, w.Layers[i].KNorm = nil, nil
		}
		if d := maxDiff(lastLogits(t, l.Model, prompt), want); d < 1e-2 {
			t.Fatalf("%s: dropping the q/k norms changed the logits by only %.2g", be.Name(), d)
		}
		l.Model.Close()
	}
}

// A Qwen2-shaped directory (F16, separate lm_head, q/k/v biases).
func TestHFQwen2Shaped(t *testing.T) {
	spec := hftest.Spec{Arch: "Qwen2ForCausalLM", Vocab: 1000, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 96, DType: "F16"}
	dir := t.TempDir()
	vals := hftest.Write(t, dir, spec, 2)
	prompt := []int32{5, 900, 17, 42, 3, 999}
	want := naiveLogits(spec, 1e-6, 1e6, vals, prompt)
	for _, be := range []kernels.Backend{ref.New(), cpu.New(2)} {
		l, err := Load(LoadOptions{Path: filepath.Join(dir, "config.json")}, be)
		if err != nil {
			t.Fatal(err)
		}
		c, w := l.Model.Config, l.Model.Weights
		if c.Arch != "qwen2" || !c.QKVBias || c.QKNorm || w.Output == w.Embed || w.DType() != kernels.F16 || len(l.Generation.EOS) != 1 {
			t.Fatalf("config %+v, generation %+v", c, l.Generation)
		}
		if d := maxDiff(lastLogits(t, l.Model, prompt), want); d > 2e-4 {
			t.Fatalf("%s: logits differ from the float64 reference by %.2g", be.Name(), d)
		}
		for i := range w.Layers {
			w.Layers[i].QBias, w.Layers[i].KBias, w.Layers[i].VBias = nil, nil, nil
		}
		if d := maxDiff(lastLogits(t, l.Model, prompt), want); d < 1e-2 {
			t.Fatalf("%s: dropping the biases changed the logits by only %.2g", be.Name(), d)
		}
		l.Model.Close()
	}
}

// Llama and Mistral directories with head_dim given and F32 weights.
func TestHFLlamaMistralShaped(t *testing.T) {
	for _, arch := range []string{"LlamaForCausalLM", "MistralForCausalLM"} {
		spec := hftest.Spec{Arch: arch, Vocab: 300, Dim: 48, Layers: 2, Heads: 6, KVHeads: 2, HeadDim: 16, FF: 80, DType: "F32", Tie: arch == "MistralForCausalLM"}
		dir := t.TempDir()
		vals := hftest.Write(t, dir, spec, 3)
		prompt := []int32{1, 200, 17, 42, 3}
		l, err := Load(LoadOptions{Path: dir}, cpu.New(2))
		if err != nil {
			t.Fatal(err)
		}
		if d := maxDiff(lastLogits(t, l.Model, prompt), naiveLogits(spec, 1e-6, 1e6, vals, prompt)); d > 2e-5 {
			t.Fatalf("%s: logits differ from the float64 reference by %.2g", arch, d)
		}
		l.Model.Close()
	}
}

func TestHFDummy(t *testing.T) {
	// A directory with config.json and tokenizer.json but no weights, with
	// --load-format dummy: random weights of its shape, tokenizer from Dir.
	dir := t.TempDir()
	cfg := qwen3Spec.Config()
	cfg["vocab_size"] = 1000
	hftest.WriteJSON(t, filepath.Join(dir, "config.json"), cfg)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Load(LoadOptions{Path: dir, Format: "dummy", DummyDType: kernels.BF16}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	w := l.Model.Weights
	if l.Dir != dir || l.GGUF != nil || l.Format != "dummy" || !l.Model.Config.QKNorm || w.Layers[0].QNorm == nil || w.Output != w.Embed || w.DType() != kernels.BF16 {
		t.Fatalf("dummy HF dir: Dir %q Format %q config %+v", l.Dir, l.Format, l.Model.Config)
	}
	lastLogits(t, l.Model, []int32{1, 2, 3})
	// Without --load-format dummy a directory with no weights is an error.
	if _, err := Load(LoadOptions{Path: dir}, ref.New()); err == nil || !strings.Contains(err.Error(), "model.safetensors") {
		t.Fatalf("no weights: %v", err)
	}
	// A bare config.json keeps today's behaviour: dummy only, bundled tokenizer.
	if _, err := Load(LoadOptions{Path: filepath.Join(dir, "config.json")}, ref.New()); err == nil || !strings.Contains(err.Error(), "dummy") {
		t.Fatalf("bare config without dummy: %v", err)
	}
	l, err = Load(LoadOptions{Path: filepath.Join(dir, "config.json"), Format: "dummy"}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	if l.Dir != "" || l.GGUF == nil || l.Model.Config.Arch != "qwen3" {
		t.Fatalf("bare config: Dir %q GGUF %v arch %s", l.Dir, l.GGUF != nil, l.Model.Config.Arch)
	}
	// A HF dir with weights but dummy format, and no tokenizer.json: the
	// bundled tokenizer, as for a bare config.
	l, err = Load(LoadOptions{Path: storiesHF, Format: "dummy"}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	if l.Dir != storiesHF || l.Format != "dummy" {
		t.Fatalf("stories dummy: Dir %q Format %q", l.Dir, l.Format)
	}
}

func TestHFConfig(t *testing.T) {
	parse := func(extra map[string]any, strict bool) (Config, error) {
		cfg := hftest.Spec{Arch: "LlamaForCausalLM", Vocab: 128256, Dim: 4096, Layers: 32, Heads: 32, KVHeads: 8, HeadDim: 128, FF: 14336, DType: "BF16"}.Config()
		delete(cfg, "head_dim")
		for k, v := range extra {
			cfg[k] = v
		}
		b, _ := json.Marshal(cfg)
		return parseHFConfig(b, strict)
	}
	c, err := parse(map[string]any{"rope_theta": 500000.0, "rope_scaling": map[string]any{"factor": 8.0, "low_freq_factor": 1.0,
		"high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	f := c.RoPE.Factors
	if c.HeadDim != 128 || len(f) != 64 || f[0] != 1 || f[63] != 8 || c.RoPE.Theta != 500000 {
		t.Fatalf("llama3 config %+v", c)
	}
	// Pair 32 of Llama 3.1 (wavelength ~4.4k tokens) lies in the smoothed band.
	wave := 2 * math.Pi * math.Pow(500000, 64.0/128)
	smooth := (8192/wave - 1) / 3
	if want := 1 / ((1-smooth)/8 + smooth); math.Abs(float64(f[32])-want) > 1e-4 || f[32] <= 1 || f[32] >= 8 {
		t.Fatalf("factor 32 = %v, want %v", f[32], want)
	}
	for i := 1; i < len(f); i++ {
		if f[i] < f[i-1] {
			t.Fatalf("factors not monotonic: %v", f)
		}
	}
	c, err = parse(map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 4.0}, "head_dim": 64}, true)
	if err != nil || c.RoPE.PosScale != 0.25 || c.HeadDim != 64 || c.RoPE.Dim != 64 {
		t.Fatalf("linear: %+v %v", c, err)
	}
	c, err = parse(map[string]any{"architectures": []string{"MistralForCausalLM"}, "sliding_window": 4096, "max_position_embeddings": 32768}, true)
	if err != nil || c.Arch != "mistral" || c.ContextLength != 4096 {
		t.Fatalf("mistral sliding window: %+v %v", c, err)
	}
	for _, bad := range []struct {
		extra map[string]any
		want  string
	}{
		{map[string]any{"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2"}, "unsupported architecture"},
		{map[string]any{"rope_scaling": map[string]any{"type": "yarn", "factor": 4.0}}, "yarn"},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0}}, "llama3"},
		{map[string]any{"hidden_act": "gelu"}, "gelu"},
		{map[string]any{"attention_bias": true}, "attention_bias"},
		{map[string]any{"num_key_value_heads": 5}, "grouped"},
		{map[string]any{"vocab_size": 0}, "lacks"},
		{map[string]any{"vocab_size": "x"}, "cannot unmarshal"},
	} {
		if _, err := parse(bad.extra, true); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: err %v, want %q", bad.extra, err, bad.want)
		}
	}
	// The lenient (dummy) reading runs an unknown architecture as a Llama
	// and ignores scaling it cannot apply.
	c, err = parse(map[string]any{"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2", "rope_scaling": map[string]any{"type": "yarn", "factor": 4.0}}, false)
	if err != nil || c.Arch != "llama" {
		t.Fatalf("lenient: %+v %v", c, err)
	}
}

func TestHFLoadErrors(t *testing.T) {
	spec := hftest.Spec{Arch: "LlamaForCausalLM", Vocab: 64, Dim: 32, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 16, FF: 48, DType: "F32"}
	good := t.TempDir()
	hftest.Write(t, good, spec, 4)
	img, err := os.ReadFile(filepath.Join(good, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	sf, err := ParseSafetensors(img)
	if err != nil {
		t.Fatal(err)
	}
	read := func() []hftest.Tensor {
		var out []hftest.Tensor
		for _, ti := range sf.Tensors {
			_, data, _ := sf.Tensor(ti.Name)
			out = append(out, hftest.Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Raw: data})
		}
		return out
	}
	cases := []struct {
		name   string
		mutate func(dir string, ts []hftest.Tensor) []hftest.Tensor
		want   string
	}{
		{"missing tensor", func(_ string, ts []hftest.Tensor) []hftest.Tensor { return ts[1:] }, "no tensor"},
		{"wrong shape", func(_ string, ts []hftest.Tensor) []hftest.Tensor {
			for i := range ts {
				if strings.HasSuffix(ts[i].Name, "q_proj.weight") {
					ts[i].Shape = []int64{16, 64}
				}
			}
			return ts
		}, "has shape [16 64], want [32 32]"},
		{"integer weights", func(_ string, ts []hftest.Tensor) []hftest.Tensor {
			for i := range ts {
				if strings.HasSuffix(ts[i].Name, "up_proj.weight") {
					ts[i].DType = "I32"
				}
			}
			return ts
		}, "dtype I32"},
		{"o_proj bias", func(_ string, ts []hftest.Tensor) []hftest.Tensor {
			return append(ts, hftest.Tensor{Name: "model.layers.0.self_attn.o_proj.bias", DType: "F32", Shape: []int64{32}, Vals: make([]float32, 32)})
		}, "not supported"},
		{"unannounced q/k/v bias", func(_ string, ts []hftest.Tensor) []hftest.Tensor {
			return append(ts, hftest.Tensor{Name: "model.layers.0.self_attn.q_proj.bias", DType: "F32", Shape: []int64{32}, Vals: make([]float32, 32)})
		}, "biases"},
		{"index names a missing tensor", func(dir string, ts []hftest.Tensor) []hftest.Tensor {
			hftest.WriteSafetensors(t, filepath.Join(dir, "model-00001-of-00001.safetensors"), ts, nil)
			hftest.WriteJSON(t, filepath.Join(dir, "model.safetensors.index.json"), map[string]any{"weight_map": map[string]string{"lm_head.weight": "model-00001-of-00001.safetensors", "model.extra.weight": "model-00001-of-00001.safetensors"}})
			return nil
		}, "does not hold it"},
		{"index escapes the directory", func(dir string, ts []hftest.Tensor) []hftest.Tensor {
			hftest.WriteJSON(t, filepath.Join(dir, "model.safetensors.index.json"), map[string]any{"weight_map": map[string]string{"x": "../model.safetensors"}})
			return nil
		}, "not a file in the model directory"},
		{"truncated file", func(dir string, ts []hftest.Tensor) []hftest.Tensor {
			if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), img[:len(img)-4], 0o644); err != nil {
				t.Fatal(err)
			}
			return nil
		}, "outside"},
	}
	for _, tc := range cases {
		dir := t.TempDir()
		copyFile(t, filepath.Join(good, "config.json"), filepath.Join(dir, "config.json"))
		if ts := tc.mutate(dir, read()); ts != nil {
			hftest.WriteSafetensors(t, filepath.Join(dir, "model.safetensors"), ts, nil)
		}
		_, err := Load(LoadOptions{Path: dir}, ref.New())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := Load(LoadOptions{Path: good, Format: "gguf"}, ref.New()); err == nil {
		t.Error("a HF directory loaded as GGUF")
	}
	if _, err := Load(LoadOptions{Path: t.TempDir()}, ref.New()); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("empty directory: %v", err)
	}
}
