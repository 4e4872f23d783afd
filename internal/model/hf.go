package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/batonlm/baton/internal/kernels"
)

// Hugging Face model directories: config.json gives the shape,
// model.safetensors (or shards listed in model.safetensors.index.json) the
// weights, generation_config.json the default generation settings.

// hfArchs maps config.json architectures to baton's names.
var hfArchs = map[string]string{
	"LlamaForCausalLM":    "llama",
	"MistralForCausalLM":  "mistral",
	"Qwen2ForCausalLM":    "qwen2",
	"Qwen3ForCausalLM":    "qwen3",
	"Qwen3MoeForCausalLM": "qwen3moe",
	"MixtralForCausalLM":  "mixtral",
}

// hfUnsupportedMoE are mixture-of-experts architectures whose refusal
// names what baton's forward pass lacks for them.
var hfUnsupportedMoE = map[string]string{
	"Qwen2MoeForCausalLM":            "shared experts",
	"DeepseekV2ForCausalLM":          "MLA attention, shared experts and expert groups",
	"DeepseekV3ForCausalLM":          "MLA attention, shared experts, expert groups and sigmoid routing",
	"GptOssForCausalLM":              "attention sinks, sliding-window layers and biased experts",
	"Qwen3NextForCausalLM":           "linear attention layers and shared experts",
	"Llama4ForCausalLM":              "shared experts and interleaved dense layers",
	"Llama4ForConditionalGeneration": "shared experts and interleaved dense layers",
}

// hfModelTypes maps config.json model_type values to baton's names, for
// files that name no architecture.
var hfModelTypes = map[string]string{"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
	"qwen3_moe": "qwen3moe", "mixtral": "mixtral"}

// hfConfig is the part of a Hugging Face config.json baton reads.
type hfConfig struct {
	Architectures    []string        `json:"architectures"`
	ModelType        string          `json:"model_type"`
	Vocab            int             `json:"vocab_size"`
	Hidden           int             `json:"hidden_size"`
	Layers           int             `json:"num_hidden_layers"`
	Heads            int             `json:"num_attention_heads"`
	KVHeads          int             `json:"num_key_value_heads"`
	HeadDim          int             `json:"head_dim"`
	FF               int             `json:"intermediate_size"`
	MaxPos           int             `json:"max_position_embeddings"`
	Eps              float64         `json:"rms_norm_eps"`
	Theta            float64         `json:"rope_theta"`
	RopeScaling      json.RawMessage `json:"rope_scaling"`
	RopeParameters   json.RawMessage `json:"rope_parameters"`
	Tie              *bool           `json:"tie_word_embeddings"`
	AttentionBias    *bool           `json:"attention_bias"`
	MLPBias          *bool           `json:"mlp_bias"`
	HiddenAct        string          `json:"hidden_act"`
	SlidingWindow    *int            `json:"sliding_window"`
	UseSlidingWindow *bool           `json:"use_sliding_window"`
	EOS              json.RawMessage `json:"eos_token_id"`

	// Mixtures of experts: Qwen3-MoE says num_experts, Mixtral
	// num_local_experts.
	NumExperts      int   `json:"num_experts"`
	NumLocalExperts int   `json:"num_local_experts"`
	ExpertsPerTok   int   `json:"num_experts_per_tok"`
	MoEFF           int   `json:"moe_intermediate_size"`
	NormTopK        *bool `json:"norm_topk_prob"`
	SparseStep      *int  `json:"decoder_sparse_step"`
	MLPOnlyLayers   []int `json:"mlp_only_layers"`
	// Layouts baton does not run, read to name them when refusing.
	SharedExpertFF int `json:"shared_expert_intermediate_size"`
	SharedExperts  int `json:"n_shared_experts"`
	ExpertGroups   int `json:"n_group"`
	KVLoRARank     int `json:"kv_lora_rank"`
}

// unsupportedMoE names what of h's layout the forward pass does not run.
func (h *hfConfig) unsupportedMoE() []string {
	var out []string
	if h.SharedExpertFF > 0 || h.SharedExperts > 0 {
		out = append(out, "shared experts")
	}
	if h.ExpertGroups > 1 {
		out = append(out, fmt.Sprintf("expert groups (n_group %d)", h.ExpertGroups))
	}
	if h.KVLoRARank > 0 {
		out = append(out, "MLA attention (kv_lora_rank)")
	}
	if len(h.MLPOnlyLayers) > 0 || h.SparseStep != nil && *h.SparseStep > 1 {
		out = append(out, "dense layers among the sparse ones (mlp_only_layers, decoder_sparse_step)")
	}
	return out
}

// hfRope is a rope_scaling (or rope_parameters) object.
type hfRope struct {
	Type         string  `json:"type"`
	RopeType     string  `json:"rope_type"`
	Factor       float64 `json:"factor"`
	LowFreq      float64 `json:"low_freq_factor"`
	HighFreq     float64 `json:"high_freq_factor"`
	OriginalMax  int     `json:"original_max_position_embeddings"`
	Theta        float64 `json:"rope_theta"`
	PartialRatio float64 `json:"partial_rotary_factor"`
}

// parseHFConfig turns config.json into a Config. strict (loading real
// weights) refuses architectures and settings the forward pass would get
// wrong; lenient (dummy weights) runs anything as the nearest shape.
func parseHFConfig(b []byte, strict bool) (Config, error) {
	var h hfConfig
	if err := json.Unmarshal(b, &h); err != nil {
		return Config{}, err
	}
	c := Config{Arch: "llama", Vocab: h.Vocab, Dim: h.Hidden, Layers: h.Layers, Heads: h.Heads, KVHeads: h.KVHeads,
		HeadDim: h.HeadDim, FF: h.FF, ContextLength: h.MaxPos, NormEps: float32(h.Eps)}
	arch, known := "", false
	for _, a := range h.Architectures {
		if arch, known = hfArchs[a]; known {
			break
		}
	}
	if !known {
		arch, known = hfModelTypes[h.ModelType]
	}
	switch {
	case known:
		c.Arch = arch
	case strict:
		for _, a := range h.Architectures {
			if why := hfUnsupportedMoE[a]; why != "" {
				return c, fmt.Errorf("architecture %s is not supported: baton does not run %s", a, why)
			}
		}
		if miss := h.unsupportedMoE(); len(miss) > 0 {
			return c, fmt.Errorf("unsupported architecture %v (model_type %q): baton does not run %s", h.Architectures, h.ModelType, strings.Join(miss, ", "))
		}
		return c, fmt.Errorf("unsupported architecture %v (model_type %q); LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM and MixtralForCausalLM are", h.Architectures, h.ModelType)
	}
	// Every supported architecture uses Hugging Face's rotate-half RoPE,
	// which pairs dimension i with i+head_dim/2: NeoX style. (GGUF
	// converters permute Llama's Q and K for adjacent pairs instead.)
	c.RoPE.NeoX = true
	switch c.Arch {
	case "qwen2":
		c.QKVBias = true
	case "qwen3", "qwen3moe":
		c.QKNorm = true
	}
	if err := hfExperts(&c, &h, strict); err != nil {
		return c, err
	}
	if h.AttentionBias != nil && *h.AttentionBias {
		if strict && c.Arch != "qwen2" {
			// Llama-style attention_bias also puts a bias on o_proj.
			return c, fmt.Errorf("attention_bias is not supported for %s", c.Arch)
		}
	}
	if strict && h.MLPBias != nil && *h.MLPBias {
		return c, errors.New("mlp_bias is not supported")
	}
	if strict && h.HiddenAct != "" && h.HiddenAct != "silu" {
		return c, fmt.Errorf("hidden_act %q is not supported (silu is)", h.HiddenAct)
	}
	c.TieEmbeddings = h.Tie != nil && *h.Tie
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Dim / c.Heads
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-5
	}
	if c.ContextLength == 0 {
		c.ContextLength = 2048
	}
	// Mistral 7B v0.1 attends over a sliding window of 4096; baton's
	// attention is full, which is the same thing as long as sequences stay
	// within the window.
	if (c.Arch == "mistral" || c.Arch == "mixtral") && h.SlidingWindow != nil && *h.SlidingWindow > 0 && *h.SlidingWindow < c.ContextLength &&
		(h.UseSlidingWindow == nil || *h.UseSlidingWindow) {
		c.ContextLength = *h.SlidingWindow
	}
	c.RoPE.Dim, c.RoPE.Theta = c.HeadDim, float32(h.Theta)

	// rope_scaling, or (newer transformers) rope_parameters, which also
	// carries rope_theta.
	var rs hfRope
	for _, raw := range []json.RawMessage{h.RopeParameters, h.RopeScaling} {
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		var r hfRope
		if err := json.Unmarshal(raw, &r); err != nil {
			return c, fmt.Errorf("rope scaling: %w", err)
		}
		if r.Theta > 0 && c.RoPE.Theta == 0 {
			c.RoPE.Theta = float32(r.Theta)
		}
		if rs.Type == "" && rs.RopeType == "" {
			rs = r
		}
	}
	if c.RoPE.Theta == 0 {
		c.RoPE.Theta = 10000
	}
	if err := applyRopeScaling(&c, rs); err != nil && strict {
		return c, err
	}
	if strict {
		switch {
		case c.Vocab <= 0 || c.Dim <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.FF <= 0:
			return c, errors.New("config.json lacks vocab_size, hidden_size, num_hidden_layers, num_attention_heads or intermediate_size")
		case c.Dim > 1<<20 || c.Layers > 1<<12 || c.Heads > 1<<12 || c.HeadDim > 1<<14 || c.FF > 1<<22 || c.Vocab > 1<<24:
			return c, errors.New("config.json has an implausible shape")
		}
	}
	return c, c.Validate()
}

// hfExperts reads a mixture of experts' routing. Both architectures route
// as transformers does: softmax over the router's logits, the top
// num_experts_per_tok, and (Mixtral always, Qwen3-MoE where
// norm_topk_prob says so, its default being false) the chosen weights
// renormalised.
func hfExperts(c *Config, h *hfConfig, strict bool) error {
	n := max(h.NumExperts, h.NumLocalExperts)
	moe := c.Arch == "qwen3moe" || c.Arch == "mixtral"
	if strict {
		if miss := h.unsupportedMoE(); len(miss) > 0 {
			return fmt.Errorf("this mixture of experts needs what baton does not run: %s", strings.Join(miss, ", "))
		}
		if moe && (n <= 0 || h.ExpertsPerTok <= 0) {
			return fmt.Errorf("%s config.json lacks num_experts (num_local_experts) or num_experts_per_tok", c.Arch)
		}
		if !moe && n > 0 {
			return fmt.Errorf("config.json gives %d experts to %s, a dense architecture", n, c.Arch)
		}
	}
	if n <= 0 || (!moe && strict) {
		return nil
	}
	c.Experts, c.ExpertsUsed = n, h.ExpertsPerTok
	if c.ExpertsUsed <= 0 || c.ExpertsUsed > n {
		c.ExpertsUsed = min(2, n)
	}
	// Qwen3-MoE's intermediate_size is the dense FFN's, which none of its
	// layers has; Mixtral's is the experts'.
	if h.MoEFF > 0 {
		c.FF = h.MoEFF
	}
	c.ExpertNorm = c.Arch == "mixtral" || h.NormTopK != nil && *h.NormTopK
	return nil
}

// applyRopeScaling sets PosScale (linear) or per-pair Factors (llama3).
func applyRopeScaling(c *Config, r hfRope) error {
	typ := r.RopeType
	if typ == "" {
		typ = r.Type
	}
	switch typ {
	case "", "default":
		return nil
	case "linear":
		if r.Factor <= 0 {
			return fmt.Errorf("linear rope scaling with factor %v", r.Factor)
		}
		c.RoPE.PosScale = float32(1 / r.Factor)
		return nil
	case "llama3":
		if r.Factor <= 0 || r.LowFreq <= 0 || r.HighFreq <= r.LowFreq || r.OriginalMax <= 0 {
			return fmt.Errorf("llama3 rope scaling needs factor, low_freq_factor < high_freq_factor and original_max_position_embeddings (have %+v)", r)
		}
		c.RoPE.Factors = llama3RopeFactors(c.RoPE.Dim, float64(c.RoPE.Theta), r)
		return nil
	}
	return fmt.Errorf("rope scaling of type %q is not supported (linear and llama3 are)", typ)
}

// llama3RopeFactors gives, per rotated pair, what its frequency is divided
// by, as transformers' _compute_llama3_parameters scales inv_freq: long
// wavelengths are slowed by factor, short ones kept, and the band between
// interpolated.
func llama3RopeFactors(dim int, theta float64, r hfRope) []float32 {
	lowWave := float64(r.OriginalMax) / r.LowFreq
	highWave := float64(r.OriginalMax) / r.HighFreq
	out := make([]float32, dim/2)
	for i := range out {
		freq := math.Pow(theta, -2*float64(i)/float64(dim))
		wave := 2 * math.Pi / freq
		switch {
		case wave < highWave:
			out[i] = 1
		case wave > lowWave:
			out[i] = float32(r.Factor)
		default:
			smooth := (float64(r.OriginalMax)/wave - r.LowFreq) / (r.HighFreq - r.LowFreq)
			out[i] = float32(1 / ((1-smooth)/r.Factor + smooth))
		}
	}
	return out
}

// GenerationConfig is what generation_config.json says about generating:
// the ids that end generation and the default sampling settings. Fields
// the file does not give are nil (or empty).
type GenerationConfig struct {
	// EOS are generation_config.json's eos_token_id (one or a list), or
	// config.json's when the former has none.
	EOS []int32
	BOS *int32
	// DoSample is do_sample; transformers samples only when it is true and
	// decodes greedily otherwise, whatever the temperature says.
	DoSample          *bool
	Temperature       *float64
	TopP              *float64
	TopK              *int
	MinP              *float64
	RepetitionPenalty *float64
	MaxNewTokens      *int
}

// parseTokenIDs reads a token id field that may be an integer, a list of
// integers or null.
func parseTokenIDs(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int64
	if err := json.Unmarshal(raw, &one); err == nil {
		if one < 0 || one > math.MaxInt32 {
			return nil, fmt.Errorf("token id %d out of range", one)
		}
		return []int32{int32(one)}, nil
	}
	var many []int64
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("token ids must be an integer or a list of integers: %s", raw)
	}
	out := make([]int32, 0, len(many))
	for _, v := range many {
		if v < 0 || v > math.MaxInt32 {
			return nil, fmt.Errorf("token id %d out of range", v)
		}
		out = append(out, int32(v))
	}
	return out, nil
}

// ReadGenerationConfig reads dir/generation_config.json, falling back to
// config.json's eos_token_id for EOS. A directory without the file gives
// an empty config and no error.
func ReadGenerationConfig(dir string) (GenerationConfig, error) {
	var g GenerationConfig
	b, err := os.ReadFile(filepath.Join(dir, "generation_config.json"))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return g, err
	default:
		var h struct {
			EOS               json.RawMessage `json:"eos_token_id"`
			BOS               json.RawMessage `json:"bos_token_id"`
			DoSample          *bool           `json:"do_sample"`
			Temperature       *float64        `json:"temperature"`
			TopP              *float64        `json:"top_p"`
			TopK              *int            `json:"top_k"`
			MinP              *float64        `json:"min_p"`
			RepetitionPenalty *float64        `json:"repetition_penalty"`
			MaxNewTokens      *int            `json:"max_new_tokens"`
		}
		if err := json.Unmarshal(b, &h); err != nil {
			return g, fmt.Errorf("model: %s: %w", filepath.Join(dir, "generation_config.json"), err)
		}
		if g.EOS, err = parseTokenIDs(h.EOS); err != nil {
			return g, fmt.Errorf("model: generation_config.json eos_token_id: %w", err)
		}
		if bos, err := parseTokenIDs(h.BOS); err == nil && len(bos) == 1 {
			g.BOS = &bos[0]
		}
		g.DoSample, g.Temperature, g.TopP, g.TopK, g.MinP = h.DoSample, h.Temperature, h.TopP, h.TopK, h.MinP
		g.RepetitionPenalty, g.MaxNewTokens = h.RepetitionPenalty, h.MaxNewTokens
	}
	if len(g.EOS) == 0 {
		if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
			var h struct {
				EOS json.RawMessage `json:"eos_token_id"`
			}
			if json.Unmarshal(b, &h) == nil {
				g.EOS, _ = parseTokenIDs(h.EOS)
			}
		}
	}
	return g, nil
}

// HFDir reports whether path names a Hugging Face model directory with
// weights — the directory itself, or its config.json — and returns the
// directory. A config.json with no weights beside it is not one (it is a
// shape for --load-format dummy).
func HFDir(path string) (string, bool) {
	if path == "" {
		return "", false
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", false
	}
	if st.IsDir() {
		_, err := os.Stat(filepath.Join(path, "config.json"))
		return path, err == nil
	}
	if filepath.Base(path) == "config.json" {
		dir := filepath.Dir(path)
		if files, err := safetensorsFiles(dir); err == nil && len(files) > 0 {
			return dir, true
		}
	}
	return "", false
}

// safetensorsFiles lists the weight files of dir: model.safetensors, the
// shards model.safetensors.index.json names, or else every *.safetensors.
func safetensorsFiles(dir string) ([]string, error) {
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
		return []string{"model.safetensors"}, nil
	}
	idx := filepath.Join(dir, "model.safetensors.index.json")
	if b, err := os.ReadFile(idx); err == nil {
		wm, err := parseIndex(b)
		if err != nil {
			return nil, fmt.Errorf("model: %s: %w", idx, err)
		}
		var files []string
		for _, f := range wm {
			if !slices.Contains(files, f) {
				files = append(files, f)
			}
		}
		slices.Sort(files)
		return files, nil
	}
	m, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, err
	}
	files := make([]string, len(m))
	for i, p := range m {
		files[i] = filepath.Base(p)
	}
	return files, nil
}

// parseIndex reads the weight_map of model.safetensors.index.json. Shard
// names must be plain file names in the same directory.
func parseIndex(b []byte) (map[string]string, error) {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, err
	}
	if len(idx.WeightMap) == 0 {
		return nil, errors.New("weight_map is empty")
	}
	for name, f := range idx.WeightMap {
		if f == "" || f != filepath.Base(f) || f == "." || f == ".." || strings.ContainsAny(f, `/\`) {
			return nil, fmt.Errorf("tensor %q is in %q, which is not a file in the model directory", name, f)
		}
	}
	return idx.WeightMap, nil
}

// hfWeights is an open set of safetensors files with a tensor-name index.
var hfLayerNames = layerNames{
	attnNorm: "model.layers.%d.input_layernorm.weight", q: "model.layers.%d.self_attn.q_proj.weight",
	k: "model.layers.%d.self_attn.k_proj.weight", v: "model.layers.%d.self_attn.v_proj.weight",
	o: "model.layers.%d.self_attn.o_proj.weight", ffnNorm: "model.layers.%d.post_attention_layernorm.weight",
	gate: "model.layers.%d.mlp.gate_proj.weight", up: "model.layers.%d.mlp.up_proj.weight", down: "model.layers.%d.mlp.down_proj.weight",
	qBias: "model.layers.%d.self_attn.q_proj.bias", kBias: "model.layers.%d.self_attn.k_proj.bias", vBias: "model.layers.%d.self_attn.v_proj.bias",
	qNorm: "model.layers.%d.self_attn.q_norm.weight", kNorm: "model.layers.%d.self_attn.k_norm.weight",
	router: "model.layers.%d.mlp.gate.weight", expGate: "model.layers.%d.mlp.experts.%d.gate_proj.weight",
	expUp: "model.layers.%d.mlp.experts.%d.up_proj.weight", expDown: "model.layers.%d.mlp.experts.%d.down_proj.weight",
}

// hfNames are arch's tensor names: Mixtral's experts are w1 (gate), w3
// (up) and w2 (down) under block_sparse_moe.
func hfNames(arch string) layerNames {
	n := hfLayerNames
	if arch == "mixtral" {
		n.router = "model.layers.%d.block_sparse_moe.gate.weight"
		n.expGate = "model.layers.%d.block_sparse_moe.experts.%d.w1.weight"
		n.expUp = "model.layers.%d.block_sparse_moe.experts.%d.w3.weight"
		n.expDown = "model.layers.%d.block_sparse_moe.experts.%d.w2.weight"
	}
	return n
}

type hfWeights struct {
	files  []*SafetensorsFile
	byName map[string]*SafetensorsFile
	// used counts the tensors handed out, for progress.
	used, total int
	progress    func(done, total int)
}

func openHFWeights(dir string) (*hfWeights, error) {
	names, err := safetensorsFiles(dir)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("model: %s has no model.safetensors, model.safetensors.index.json or *.safetensors", dir)
	}
	var wm map[string]string
	if b, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json")); err == nil && !slices.Equal(names, []string{"model.safetensors"}) {
		if wm, err = parseIndex(b); err != nil {
			return nil, err
		}
	}
	w := &hfWeights{byName: map[string]*SafetensorsFile{}}
	byFile := map[string]*SafetensorsFile{}
	for _, n := range names {
		f, err := OpenSafetensors(filepath.Join(dir, n))
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("model: %w", err)
		}
		w.files = append(w.files, f)
		byFile[n] = f
		for _, t := range f.Tensors {
			if prev, dup := w.byName[t.Name]; dup && prev != f {
				w.Close()
				return nil, fmt.Errorf("model: tensor %q is in more than one safetensors file", t.Name)
			}
			w.byName[t.Name] = f
		}
	}
	for name, file := range wm {
		f := byFile[file]
		if f == nil || !f.HasTensor(name) {
			w.Close()
			return nil, fmt.Errorf("model: model.safetensors.index.json puts %q in %s, which does not hold it", name, file)
		}
	}
	return w, nil
}

// Close unmaps every file.
func (w *hfWeights) Close() error {
	var errs []error
	for _, f := range w.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

func (w *hfWeights) has(name string) bool { return w.byName[name] != nil }

func (w *hfWeights) tensor(name string) (SafetensorsTensor, []byte, kernels.DType, error) {
	f := w.byName[name]
	if f == nil {
		return SafetensorsTensor{}, nil, 0, fmt.Errorf("model: the weights have no tensor %q", name)
	}
	t, data, err := f.Tensor(name)
	if err != nil {
		return t, nil, 0, err
	}
	w.used++
	if w.progress != nil {
		w.progress(w.used, w.total)
	}
	var dt kernels.DType
	switch t.DType {
	case "F32":
		dt = kernels.F32
	case "F16":
		dt = kernels.F16
	case "BF16":
		dt = kernels.BF16
	default:
		return t, nil, 0, fmt.Errorf("model: tensor %q has dtype %s (F32, F16 and BF16 are supported)", name, t.DType)
	}
	return t, data, dt, nil
}

// matrix maps a [rows, cols] tensor in place: no copy, no conversion.
func (w *hfWeights) matrix(name string, rows, cols int) (*kernels.Matrix, error) {
	t, data, dt, err := w.tensor(name)
	if err != nil {
		return nil, err
	}
	if len(t.Shape) != 2 || t.Shape[0] != int64(rows) || t.Shape[1] != int64(cols) {
		return nil, fmt.Errorf("model: tensor %s has shape %s, want [%d %d]", name, describeShape(t.Shape), rows, cols)
	}
	m := &kernels.Matrix{DType: dt, Rows: rows, Cols: cols, Data: data}
	return m, m.Validate()
}

// experts maps each expert's own tensor (a checkpoint stores them apart).
func (w *hfWeights) experts(pattern string, layer, n, rows, cols int) ([]*kernels.Matrix, error) {
	out := make([]*kernels.Matrix, n)
	for e := range out {
		var err error
		if out[e], err = w.matrix(fmt.Sprintf(pattern, layer, e), rows, cols); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// vector copies a 1-D tensor of n elements to float32.
func (w *hfWeights) vector(name string, n int) ([]float32, error) {
	t, data, dt, err := w.tensor(name)
	if err != nil {
		return nil, err
	}
	if len(t.Shape) != 1 || t.Shape[0] != int64(n) {
		return nil, fmt.Errorf("model: tensor %s has shape %s, want [%d]", name, describeShape(t.Shape), n)
	}
	return vectorOf(dt, n, data)
}

// weightsFromHF maps a Hugging Face checkpoint's tensors into Weights.
// Matrices stay in the file's dtype (BF16 and F16 are not widened) and
// point into the mapping; norms and biases are copied as float32.
func weightsFromHF(w *hfWeights, c *Config, progress func(done, total int)) (*Weights, error) {
	tied := c.TieEmbeddings || !w.has("lm_head.weight")
	w.total = 2 + c.Layers*9
	if c.Experts > 0 {
		w.total = 2 + c.Layers*(7+3*c.Experts)
	}
	if !tied {
		w.total++
	}
	if c.QKVBias {
		w.total += 3 * c.Layers
	}
	if c.QKNorm {
		w.total += 2 * c.Layers
	}
	w.progress = progress
	out := &Weights{}
	var err error
	if out.Embed, err = w.matrix("model.embed_tokens.weight", c.Vocab, c.Dim); err != nil {
		return nil, err
	}
	if out.OutNorm, err = w.vector("model.norm.weight", c.Dim); err != nil {
		return nil, err
	}
	if tied {
		out.Output = out.Embed
	} else if out.Output, err = w.matrix("lm_head.weight", c.Vocab, c.Dim); err != nil {
		return nil, err
	}
	for i := 0; i < c.Layers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		for _, unsupported := range []string{"self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"} {
			if w.has(p + unsupported) {
				return nil, fmt.Errorf("model: tensor %s: biases on that projection are not supported", p+unsupported)
			}
		}
		if !c.QKVBias && w.has(p+"self_attn.q_proj.bias") {
			return nil, fmt.Errorf("model: %s has q/k/v biases but config.json does not say so", p+"self_attn")
		}
		if c.Experts > 0 && w.has(p+"mlp.shared_expert.gate_proj.weight") {
			return nil, fmt.Errorf("model: %s: shared experts are not supported", p+"mlp.shared_expert")
		}
		ly, err := loadLayer(w, hfNames(c.Arch), c, i)
		if err != nil {
			return nil, err
		}
		out.Layers = append(out.Layers, ly)
	}
	return out, nil
}
