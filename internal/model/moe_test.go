package model

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model/hftest"
)

// The mixtures of experts of the parity tests: 8 experts with 2 (Mixtral)
// or 3 (Qwen3-MoE, head_dim apart from hidden/heads) used per token, so a
// 9-token prompt routes rows to most experts, several rows to some.
var (
	qwen3MoESpec = hftest.Spec{Arch: "Qwen3MoeForCausalLM", Vocab: 500, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 96,
		Tie: true, DType: "BF16", Experts: 8, ExpertsUsed: 3, NormTopK: true}
	mixtralSpec = hftest.Spec{Arch: "MixtralForCausalLM", Vocab: 400, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 64,
		DType: "F16", Experts: 8, ExpertsUsed: 2}
	moePrompt = []int32{1, 200, 17, 42, 3, 99, 7, 300, 5}
)

// Hugging Face Qwen3-MoE (with and without norm_topk_prob) and Mixtral
// directories load with their experts in place and agree with an
// independent float64 forward pass written as transformers computes
// them, on both backends; routing any other way (renormalising or not, as
// the other architecture does) leaves that reference.
func TestHFMoEShaped(t *testing.T) {
	noNorm := qwen3MoESpec
	noNorm.NormTopK, noNorm.DType = false, "F32"
	for _, spec := range []hftest.Spec{qwen3MoESpec, noNorm, mixtralSpec} {
		dir := t.TempDir()
		vals := hftest.Write(t, dir, spec, 11)
		want := naiveLogits(spec, 1e-6, 1e6, vals, moePrompt)
		for _, be := range []kernels.Backend{ref.New(), cpu.New(2)} {
			what := fmt.Sprintf("%s norm_topk_prob %v %s on %s", spec.Arch, spec.NormTopK, spec.DType, be.Name())
			l, err := Load(LoadOptions{Path: dir}, be)
			if err != nil {
				t.Fatal(what, err)
			}
			c, w := l.Model.Config, l.Model.Weights
			arch := map[string]string{"Qwen3MoeForCausalLM": "qwen3moe", "MixtralForCausalLM": "mixtral"}[spec.Arch]
			if c.Arch != arch || c.Experts != 8 || c.ExpertsUsed != spec.ExpertsUsed || c.FF != spec.FF ||
				c.ExpertNorm != (spec.NormTopK || arch == "mixtral") || c.QKNorm != (arch == "qwen3moe") || !c.RoPE.NeoX {
				t.Fatalf("%s: config %+v", what, c)
			}
			ly := w.Layers[1]
			if ly.Gate != nil || ly.Router == nil || len(ly.Experts) != 8 || ly.Experts[7].Down.Rows != spec.Dim || ly.Experts[7].Down.Cols != spec.FF {
				t.Fatalf("%s: layer weights %+v", what, ly)
			}
			var inFiles int64
			for _, v := range vals {
				inFiles += int64(len(v))
			}
			if want := inFiles; w.Params() != want {
				t.Fatalf("%s: %d parameters, the files hold %d", what, w.Params(), want)
			}
			tol := 2e-4
			if spec.DType == "F32" {
				tol = 2e-5
			}
			if d := maxDiff(lastLogits(t, l.Model, moePrompt), want); d > tol {
				t.Fatalf("%s: logits differ from the float64 reference by %.2g", what, d)
			}
			l.Model.Config.ExpertNorm = !l.Model.Config.ExpertNorm
			if d := maxDiff(lastLogits(t, l.Model, moePrompt), want); d < 1e-2 {
				t.Fatalf("%s: routing with the other normalisation changed the logits by only %.2g", what, d)
			}
			l.Model.Close()
		}
	}
}

// ggufFromHF writes the checkpoint vals as llama.cpp's converter would:
// qwen3moe for Qwen3-MoE, llama with expert tensors for Mixtral (its q and
// k rows permuted for adjacent-pair RoPE), the experts of a layer stacked
// in one 3-D tensor per kind, the router in F32. Matrices are stored in mat
// and the experts in exp; it returns vals as the file holds them (after
// quantisation), under their Hugging Face names, for the reference.
func ggufFromHF(t *testing.T, path string, s hftest.Spec, vals map[string][]float32, mat, exp gguf.Type) map[string][]float32 {
	t.Helper()
	arch := "qwen3moe"
	if s.Arch == "MixtralForCausalLM" {
		arch = "llama"
	}
	a := arch + "."
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: arch}, {Key: "general.name", Value: "moe"},
		{Key: a + "context_length", Value: uint32(4096)}, {Key: a + "embedding_length", Value: uint32(s.Dim)},
		{Key: a + "block_count", Value: uint32(s.Layers)}, {Key: a + "feed_forward_length", Value: uint32(s.FF)},
		{Key: a + "attention.head_count", Value: uint32(s.Heads)}, {Key: a + "attention.head_count_kv", Value: uint32(s.KVHeads)},
		{Key: a + "attention.key_length", Value: uint32(s.HeadDim)}, {Key: a + "rope.dimension_count", Value: uint32(s.HeadDim)},
		{Key: a + "rope.freq_base", Value: float32(1e6)}, {Key: a + "attention.layer_norm_rms_epsilon", Value: float32(1e-6)},
		{Key: a + "vocab_size", Value: uint32(s.Vocab)},
		{Key: a + "expert_count", Value: uint32(s.Experts)}, {Key: a + "expert_used_count", Value: uint32(s.ExpertsUsed)},
	}
	if arch == "qwen3moe" {
		// The dense size, which no layer has, apart from the experts'.
		kvs[5].Value = uint32(3 * s.FF)
		kvs = append(kvs, gguf.KV{Key: a + "expert_feed_forward_length", Value: uint32(s.FF)},
			gguf.KV{Key: a + "expert_weights_norm", Value: s.NormTopK})
	}
	stored := map[string][]float32{}
	type tensor struct {
		info gguf.TensorInfo
		raw  []byte
	}
	var ts []tensor
	// add stores the rows of the HF tensors srcs (one per expert, or one)
	// as one GGUF tensor of dims, each first permuted by perm when given.
	add := func(name string, typ gguf.Type, dims []int64, perm func([]float32, bool) []float32, srcs ...string) {
		dt, err := dtypeOf(typ)
		if err != nil {
			t.Fatal(err)
		}
		var raw []byte
		for _, src := range srcs {
			v := vals[src]
			if perm != nil {
				v = perm(v, false)
			}
			enc := make([]byte, dt.RowBytes(len(v)))
			kernels.EncodeRow(enc, v, dt)
			back := make([]float32, len(v))
			(&kernels.Matrix{DType: dt, Rows: 1, Cols: len(v), Data: enc}).Row(0, back)
			if perm != nil {
				back = perm(back, true)
			}
			stored[src] = back
			raw = append(raw, enc...)
		}
		ts = append(ts, tensor{gguf.TensorInfo{Name: name, Dims: dims, Type: typ}, raw})
	}
	// permute orders each head's rows as llama.cpp's converter does for
	// adjacent-pair RoPE (row j*hd/2+i to 2i+j), or back with inverse.
	permute := func(heads int) func([]float32, bool) []float32 {
		if arch != "llama" {
			return nil
		}
		hd, cols := s.HeadDim, s.Dim
		return func(v []float32, inverse bool) []float32 {
			out := make([]float32, len(v))
			for h := range heads {
				for i := range hd / 2 {
					for j := range 2 {
						to, from := h*hd+2*i+j, h*hd+j*hd/2+i
						if inverse {
							to, from = from, to
						}
						copy(out[to*cols:][:cols], v[from*cols:][:cols])
					}
				}
			}
			return out
		}
	}
	d2 := func(rows, cols int) []int64 { return []int64{int64(cols), int64(rows)} }
	qd, kvd := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	add("token_embd.weight", mat, d2(s.Vocab, s.Dim), nil, "model.embed_tokens.weight")
	add("output_norm.weight", gguf.TypeF32, []int64{int64(s.Dim)}, nil, "model.norm.weight")
	if !s.Tie {
		add("output.weight", mat, d2(s.Vocab, s.Dim), nil, "lm_head.weight")
	}
	for l := range s.Layers {
		p, b := fmt.Sprintf("model.layers.%d.", l), fmt.Sprintf("blk.%d.", l)
		add(b+"attn_norm.weight", gguf.TypeF32, []int64{int64(s.Dim)}, nil, p+"input_layernorm.weight")
		add(b+"attn_q.weight", mat, d2(qd, s.Dim), permute(s.Heads), p+"self_attn.q_proj.weight")
		add(b+"attn_k.weight", mat, d2(kvd, s.Dim), permute(s.KVHeads), p+"self_attn.k_proj.weight")
		add(b+"attn_v.weight", mat, d2(kvd, s.Dim), nil, p+"self_attn.v_proj.weight")
		add(b+"attn_output.weight", mat, d2(s.Dim, qd), nil, p+"self_attn.o_proj.weight")
		if s.QKNorm() {
			add(b+"attn_q_norm.weight", gguf.TypeF32, []int64{int64(s.HeadDim)}, nil, p+"self_attn.q_norm.weight")
			add(b+"attn_k_norm.weight", gguf.TypeF32, []int64{int64(s.HeadDim)}, nil, p+"self_attn.k_norm.weight")
		}
		add(b+"ffn_norm.weight", gguf.TypeF32, []int64{int64(s.Dim)}, nil, p+"post_attention_layernorm.weight")
		add(b+"ffn_gate_inp.weight", gguf.TypeF32, d2(s.Experts, s.Dim), nil, s.Router(l))
		for _, k := range []struct {
			name, which string
			rows, cols  int
		}{{"ffn_gate_exps", "gate", s.FF, s.Dim}, {"ffn_up_exps", "up", s.FF, s.Dim}, {"ffn_down_exps", "down", s.Dim, s.FF}} {
			var srcs []string
			for e := range s.Experts {
				srcs = append(srcs, s.Expert(l, e, k.which))
			}
			add(b+k.name+".weight", exp, []int64{int64(k.cols), int64(k.rows), int64(s.Experts)}, nil, srcs...)
		}
	}
	infos := make([]gguf.TensorInfo, len(ts))
	for i := range ts {
		infos[i] = ts[i].info
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := gguf.Write(f, kvs, infos, func(i int, w io.Writer) error { _, err := w.Write(ts[i].raw); return err }); err != nil {
		t.Fatal(err)
	}
	return stored
}

// The same checkpoints written as llama.cpp's GGUFs (qwen3moe; Mixtral as
// llama with expert tensors) in every float dtype and in quantised formats
// agree with the float64 reference of the values the file holds: on the
// ref backend within the dense models' float tolerance, on the cpu backend
// within its tolerance for integer dot products.
func TestGGUFMoE(t *testing.T) {
	for _, base := range []hftest.Spec{qwen3MoESpec, mixtralSpec} {
		// The K formats take rows of 256.
		wide := base
		wide.Dim, wide.FF, wide.HeadDim = 256, 256, 64
		for _, ty := range []struct {
			mat, exp gguf.Type
			cpuTol   float64
		}{
			{gguf.TypeF32, gguf.TypeF32, 2e-5}, {gguf.TypeF16, gguf.TypeF16, 2e-4}, {gguf.TypeBF16, gguf.TypeBF16, 2e-4},
			{gguf.TypeQ8_0, gguf.TypeQ8_0, 3e-2}, {gguf.TypeQ8_0, gguf.TypeQ4_K, 3e-2}, {gguf.TypeF16, gguf.TypeQ6_K, 3e-2},
			{gguf.TypeQ8_0, gguf.TypeQ4_0, 3e-2},
		} {
			spec := base
			if ty.mat == gguf.TypeQ8_0 || ty.exp != ty.mat {
				spec = wide
			}
			vals := hftest.Write(t, t.TempDir(), spec, 5)
			path := filepath.Join(t.TempDir(), "moe.gguf")
			stored := ggufFromHF(t, path, spec, vals, ty.mat, ty.exp)
			want := naiveLogits(spec, 1e-6, 1e6, stored, moePrompt)
			for _, be := range []kernels.Backend{ref.New(), cpu.New(2)} {
				what := fmt.Sprintf("%s %s/%s experts on %s", spec.Arch, ty.mat, ty.exp, be.Name())
				l, err := Load(LoadOptions{Path: path, HostCopy: be.Name() == "cpu"}, be)
				if err != nil {
					t.Fatal(what, err)
				}
				c := l.Model.Config
				if c.Experts != 8 || c.ExpertsUsed != spec.ExpertsUsed || c.FF != spec.FF || !c.ExpertNorm || c.RoPE.NeoX != (spec.Arch != "MixtralForCausalLM") {
					t.Fatalf("%s: config %+v", what, c)
				}
				tol := 2e-4
				if be.Name() == "cpu" {
					tol = ty.cpuTol
				}
				if d := maxDiff(lastLogits(t, l.Model, moePrompt), want); d > tol {
					t.Fatalf("%s: logits differ from the float64 reference by %.2g", what, d)
				}
				t.Logf("%s: %.2g from the reference", what, maxDiff(lastLogits(t, l.Model, moePrompt), want))
				l.Model.Close()
			}
		}
	}
}

// A GGUF's experts are views into its one tensor per kind: loading maps
// them, and a step reads them there, with nothing copied.
func TestGGUFExpertsAreViews(t *testing.T) {
	path := filepath.Join(t.TempDir(), "moe.gguf")
	ggufFromHF(t, path, mixtralSpec, hftest.Write(t, t.TempDir(), mixtralSpec, 5), gguf.TypeF16, gguf.TypeQ8_0)
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := ConfigFromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	w, err := WeightsFromGGUF(f, &c, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, data, _ := f.Tensor("blk.1.ffn_down_exps.weight")
	for e, ex := range w.Layers[1].Experts {
		size := len(ex.Down.Data)
		if &ex.Down.Data[0] != &data[e*size] || cap(ex.Down.Data) != size {
			t.Fatalf("expert %d's down matrix is not its part of the mapped tensor", e)
		}
	}
}

// Router ties go to the lower expert index, and the weights are a softmax
// over the chosen (norm) or their share of one over all.
func TestRoute(t *testing.T) {
	logits := []float32{1, 3, 3, 0, 3, 2}
	pick, weight, taken := make([]int32, 2), make([]float32, 2), make([]bool, 6)
	route(logits, 6, 2, true, pick, weight, taken)
	if !slices.Equal(pick, []int32{1, 2}) || weight[0] != 0.5 || weight[1] != 0.5 {
		t.Fatalf("norm: picked %v weighted %v", pick, weight)
	}
	route(logits, 6, 2, false, pick, weight, taken)
	var all float64
	for _, v := range logits {
		all += math.Exp(float64(v))
	}
	if !slices.Equal(pick, []int32{1, 2}) || math.Abs(float64(weight[0])-math.Exp(3)/all) > 1e-7 {
		t.Fatalf("no norm: picked %v weighted %v", pick, weight)
	}
	route([]float32{float32(math.NaN()), -1, -2}, 3, 2, true, pick, weight, taken[:3])
	if !slices.Equal(pick, []int32{1, 2}) {
		t.Fatalf("a NaN logit was picked before real ones: %v", pick)
	}
}

// Layouts the forward pass does not run are refused at load, naming them.
func TestMoERefusals(t *testing.T) {
	base := filepath.Join(t.TempDir(), "moe.gguf")
	vals := hftest.Write(t, t.TempDir(), qwen3MoESpec, 5)
	ggufFromHF(t, base, qwen3MoESpec, vals, gguf.TypeF32, gguf.TypeF32)
	for _, tc := range []struct {
		kv   gguf.KV
		want string
	}{
		{gguf.KV{Key: "qwen3moe.expert_shared_count", Value: uint32(1)}, "shared experts"},
		{gguf.KV{Key: "qwen3moe.expert_group_count", Value: uint32(8)}, "expert groups"},
		{gguf.KV{Key: "qwen3moe.attention.kv_lora_rank", Value: uint32(512)}, "MLA attention"},
		{gguf.KV{Key: "qwen3moe.expert_gating_func", Value: uint32(2)}, "gating function 2"},
		{gguf.KV{Key: "general.architecture", Value: "deepseek2"}, "MLA attention"},
		{gguf.KV{Key: "general.architecture", Value: "qwen2moe"}, "shared experts"},
	} {
		path := withKV(t, base, tc.kv)
		if _, err := Load(LoadOptions{Path: path}, ref.New()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s = %v: %v, want an error naming %q", tc.kv.Key, tc.kv.Value, err, tc.want)
		}
		d, err := Describe(path)
		if err != nil || !strings.Contains(d.LoadError, tc.want) {
			t.Errorf("%s: describe says %v %q", tc.kv.Key, err, d.LoadError)
		}
	}
	for _, tc := range []struct {
		set  map[string]any
		want string
	}{
		{map[string]any{"shared_expert_intermediate_size": 512}, "shared experts"},
		{map[string]any{"mlp_only_layers": []int{0}}, "dense layers"},
		{map[string]any{"architectures": []string{"Qwen2MoeForCausalLM"}, "model_type": "qwen2_moe"}, "shared experts"},
		{map[string]any{"architectures": []string{"DeepseekV3ForCausalLM"}, "model_type": "deepseek_v3"}, "MLA attention"},
		{map[string]any{"num_experts": nil}, "num_experts"},
	} {
		dir := t.TempDir()
		hftest.Write(t, dir, qwen3MoESpec, 5)
		cfg := qwen3MoESpec.Config()
		for k, v := range tc.set {
			cfg[k] = v
		}
		hftest.WriteJSON(t, filepath.Join(dir, "config.json"), cfg)
		if _, err := Load(LoadOptions{Path: dir}, ref.New()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %q", tc.set, err, tc.want)
		}
	}
}

// withKV copies the GGUF at path with kv set (added or replaced).
func withKV(t *testing.T, path string, kv gguf.KV) string {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kvs := f.MetaKVs("")
	replaced := false
	for i := range kvs {
		if kvs[i].Key == kv.Key {
			kvs[i], replaced = kv, true
		}
	}
	if !replaced {
		kvs = append(kvs, kv)
	}
	infos := slices.Clone(f.Tensors)
	out := filepath.Join(t.TempDir(), "changed.gguf")
	o, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	err = gguf.Write(o, kvs, infos, func(i int, w io.Writer) error {
		_, data, err := f.Tensor(infos[i].Name)
		if err == nil {
			_, err = w.Write(data)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// --load-format dummy runs both architectures' shapes from config.json,
// and model inspect shows the experts.
func TestMoEDummyAndDescribe(t *testing.T) {
	for _, spec := range []hftest.Spec{qwen3MoESpec, mixtralSpec} {
		dir := t.TempDir()
		hftest.WriteJSON(t, filepath.Join(dir, "config.json"), spec.Config())
		for _, dt := range []kernels.DType{kernels.F32, kernels.Q8_0} {
			l, err := Load(LoadOptions{Path: filepath.Join(dir, "config.json"), Format: "dummy", DummyDType: dt}, cpu.New(2))
			if err != nil {
				t.Fatal(spec.Arch, err)
			}
			c := l.Model.Config
			if c.Experts != 8 || len(l.Model.Weights.Layers[0].Experts) != 8 || l.Model.Weights.Layers[0].Experts[3].Up.DType != dt {
				t.Fatalf("%s dummy: config %+v", spec.Arch, c)
			}
			for _, v := range lastLogits(t, l.Model, moePrompt) {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%s dummy: logit %v", spec.Arch, v)
				}
			}
		}
		hftest.Write(t, dir, spec, 5)
		d, err := Describe(dir)
		if err != nil || d.LoadError != "" {
			t.Fatalf("%s: %v %q", spec.Arch, err, d.LoadError)
		}
		want := fmt.Sprintf("experts:         8, %d used per token (ffn %d each; weights: softmax over the chosen)", spec.ExpertsUsed, spec.FF)
		if !strings.Contains(d.String(), want) {
			t.Errorf("%s: describe lacks %q:\n%s", spec.Arch, want, d)
		}
	}
}

// expertRunner is a backend that runs the experts itself, one row and one
// pick at a time from ExpertRunner's definition (the weighted sum in pick
// order), counting its calls.
type expertRunner struct {
	kernels.Backend
	calls int
}

func (r *expertRunner) Experts(out, x []float32, n int, experts []kernels.Expert, pick []int32, weight []float32, k int) {
	kernels.CheckExperts(out, x, n, experts, pick, weight, k)
	r.calls++
	d, ff := experts[0].Gate.Cols, experts[0].Gate.Rows
	g, u, y := make([]float32, ff), make([]float32, ff), make([]float32, d)
	clear(out[:n*d])
	for i := range n {
		for j := range k {
			ex := experts[pick[i*k+j]]
			r.MatMul(g, x[i*d:(i+1)*d], 1, ex.Gate)
			r.MatMul(u, x[i*d:(i+1)*d], 1, ex.Up)
			r.SwiGLU(g, g, u)
			r.MatMul(y, g, 1, ex.Down)
			for o, v := range y {
				out[i*d+o] += weight[i*k+j] * v
			}
		}
	}
}

// On a backend that is an ExpertRunner every MoE layer of a step goes to
// its Experts, with the routing the host path uses: the logits agree with
// the host path's up to the order of each row's k-term sum.
func TestExpertRunnerRunsTheLayers(t *testing.T) {
	for _, spec := range []hftest.Spec{qwen3MoESpec, mixtralSpec} {
		dir := t.TempDir()
		hftest.Write(t, dir, spec, 7)
		host, err := Load(LoadOptions{Path: dir}, ref.New())
		if err != nil {
			t.Fatal(err)
		}
		r := &expertRunner{Backend: ref.New()}
		m := New(host.Model.Config, host.Model.Weights, r)
		want, got := lastLogits(t, host.Model, moePrompt), lastLogits(t, m, moePrompt)
		if r.calls != host.Model.Config.Layers {
			t.Fatalf("%s: Experts ran %d times for %d layers", spec.Arch, r.calls, host.Model.Config.Layers)
		}
		var mag, diff float64
		for i := range want {
			mag = max(mag, math.Abs(float64(want[i])))
			diff = max(diff, math.Abs(float64(got[i]-want[i])))
		}
		if diff > 1e-5*mag {
			t.Errorf("%s: logits differ by %g (largest %g)", spec.Arch, diff, mag)
		}
	}
}
