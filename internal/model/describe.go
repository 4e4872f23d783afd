package model

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
)

// Description is what the loader sees in a model path, read from headers
// and memory-mapped tensors without computing anything: for `baton model
// inspect`.
type Description struct {
	Path string
	// Format is gguf or safetensors.
	Format string
	// Architecture is the file's own name for it: general.architecture, or
	// config.json's architectures.
	Architecture string
	Name         string // default served name
	Config       Config
	Files        []string // weight files
	Tensors      int
	Params       int64            // elements over all tensors in the files
	DTypes       map[string]int64 // elements per tensor dtype
	// Mix is which dtypes each kind of tensor has (GGUF): kind is the name
	// without its block prefix ("attn_v.weight" for blk.N.attn_v.weight),
	// mapped to tensor counts per dtype. Quantised files mix types (a
	// Q4_K_M file keeps some attn_v and ffn_down tensors in Q6_K).
	Mix   map[string]map[string]int
	Bytes int64 // tensor bytes
	// Generation is generation_config.json (HF directories only).
	Generation GenerationConfig
	// LoadError is why Load would refuse the model ("" when it loads).
	LoadError string
}

// Describe inspects a GGUF file or a Hugging Face directory (or its
// config.json) the way Load would read it; "" describes the bundled model.
// It checks every tensor Load would map, so a model that describes without
// LoadError loads.
func Describe(path string) (*Description, error) {
	if dir, ok := HFDir(path); ok {
		return describeHF(dir)
	}
	var f *gguf.File
	var err error
	d := &Description{Path: path, Format: "gguf", Name: bundled.Name, DTypes: map[string]int64{}}
	if path == "" {
		d.Path = "(bundled " + bundled.Name + ")"
		f, err = gguf.Parse(bundled.Stories260K)
	} else {
		if st, serr := os.Stat(path); serr == nil && st.IsDir() {
			return nil, fmt.Errorf("model: %s is a directory without config.json", path)
		}
		f, err = gguf.Open(path)
		d.Name = NameFromPath(path)
		d.Files = []string{filepath.Base(path)}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d.Architecture, _ = f.String("general.architecture")
	d.Tensors = len(f.Tensors)
	for _, t := range f.Tensors {
		n := t.Elements()
		d.Params += n
		d.DTypes[t.Type.String()] += n
		d.Bytes += t.Size
		if len(t.Dims) < 2 {
			continue // norms and biases: always F32, and not what a mix is about
		}
		kind := t.Name
		if rest, ok := strings.CutPrefix(kind, "blk."); ok {
			if _, after, ok := strings.Cut(rest, "."); ok {
				kind = after
			}
		}
		if d.Mix == nil {
			d.Mix = map[string]map[string]int{}
		}
		if d.Mix[kind] == nil {
			d.Mix[kind] = map[string]int{}
		}
		d.Mix[kind][t.Type.String()]++
	}
	c, err := ConfigFromGGUF(f)
	d.Config = c
	if err != nil {
		d.LoadError = err.Error()
		return d, nil
	}
	if _, err := WeightsFromGGUF(f, &c, nil); err != nil {
		d.LoadError = err.Error()
	}
	return d, nil
}

func describeHF(dir string) (*Description, error) {
	d := &Description{Path: dir, Format: "safetensors", Name: NameFromPath(dir), DTypes: map[string]int64{}}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var h struct {
		Architectures []string `json:"architectures"`
		ModelType     string   `json:"model_type"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("model: %s: %w", filepath.Join(dir, "config.json"), err)
	}
	d.Architecture = strings.Join(h.Architectures, ", ")
	if d.Architecture == "" {
		d.Architecture = h.ModelType
	}
	if d.Generation, err = ReadGenerationConfig(dir); err != nil {
		d.LoadError = err.Error()
	}
	hw, werr := openHFWeights(dir)
	if werr == nil {
		defer hw.Close()
		for _, f := range hw.files {
			for _, t := range f.Tensors {
				d.Tensors++
				n := t.Elements()
				d.Params += n
				d.DTypes[t.DType] += n
				d.Bytes += t.Size
			}
		}
	}
	if names, err := safetensorsFiles(dir); err == nil {
		d.Files = names
	}
	c, err := parseHFConfig(b, true)
	d.Config = c
	switch {
	case err != nil:
		d.LoadError = err.Error()
	case werr != nil:
		d.LoadError = werr.Error()
	default:
		if _, err := weightsFromHF(hw, &c, nil); err != nil {
			d.LoadError = err.Error()
		}
	}
	return d, nil
}

// String formats the description as aligned "key: value" lines.
func (d *Description) String() string {
	var sb strings.Builder
	line := func(k, format string, args ...any) {
		fmt.Fprintf(&sb, "%-16s %s\n", k+":", fmt.Sprintf(format, args...))
	}
	c := &d.Config
	line("path", "%s", d.Path)
	files := ""
	if len(d.Files) > 0 {
		files = fmt.Sprintf("%d file(s): %s, ", len(d.Files), strings.Join(d.Files, ", "))
	}
	line("format", "%s (%s%d tensors, %s)", d.Format, files, d.Tensors, humanBytes(d.Bytes))
	line("architecture", "%s (%s)", c.Arch, d.Architecture)
	line("served name", "%s", d.Name)
	line("parameters", "%s (%s)", commas(d.Params), humanCount(d.Params))
	var dts []string
	for k := range d.DTypes {
		dts = append(dts, k)
	}
	slices.SortFunc(dts, func(a, b string) int { return int(d.DTypes[b] - d.DTypes[a]) })
	for i, k := range dts {
		dts[i] = fmt.Sprintf("%s %s", k, commas(d.DTypes[k]))
	}
	line("dtypes", "%s", strings.Join(dts, ", "))
	if mixed := d.mixString(); mixed != "" {
		line("tensor types", "%s", mixed)
	}
	line("context length", "%d", c.ContextLength)
	line("shape", "vocab %d, hidden %d, layers %d, heads %d, kv heads %d, head dim %d, ffn %d", c.Vocab, c.Dim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.FF)
	if c.Experts > 0 {
		weights := "softmax over all, the chosen not renormalised"
		if c.ExpertNorm {
			weights = "softmax over the chosen"
		}
		line("experts", "%d, %d used per token (ffn %d each; weights: %s)", c.Experts, c.ExpertsUsed, c.FF, weights)
	}
	rope := fmt.Sprintf("theta %g, %d dims, ", c.RoPE.Theta, c.RoPE.Dim)
	if c.RoPE.NeoX {
		rope += "rotate-half (neox) pairs"
	} else {
		rope += "adjacent pairs"
	}
	if c.RoPE.PosScale != 0 {
		rope += fmt.Sprintf(", linear scaling x%g", c.RoPE.PosScale)
	}
	if c.RoPE.Factors != nil {
		rope += fmt.Sprintf(", per-pair frequency factors %g..%g", c.RoPE.Factors[0], c.RoPE.Factors[len(c.RoPE.Factors)-1])
	}
	line("rope", "%s", rope)
	line("norm eps", "%g", c.NormEps)
	var extras []string
	if c.QKVBias {
		extras = append(extras, "q/k/v biases")
	}
	if c.QKNorm {
		extras = append(extras, "per-head q/k RMSNorm")
	}
	if c.TieEmbeddings {
		extras = append(extras, "tied embeddings")
	}
	if len(extras) > 0 {
		line("features", "%s", strings.Join(extras, ", "))
	}
	if g := d.Generation.String(); g != "" {
		line("generation", "%s", g)
	}
	if d.LoadError != "" {
		line("loads", "NO: %s", d.LoadError)
	} else {
		line("loads", "yes")
	}
	return sb.String()
}

// String lists the settings given, like "eos [2], temperature 0.6".
func (g GenerationConfig) String() string {
	var parts []string
	if len(g.EOS) > 0 {
		parts = append(parts, fmt.Sprintf("eos %v", g.EOS))
	}
	if g.DoSample != nil {
		parts = append(parts, fmt.Sprintf("do_sample %v", *g.DoSample))
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{{"temperature", g.Temperature}, {"top_p", g.TopP}, {"min_p", g.MinP}, {"repetition_penalty", g.RepetitionPenalty}} {
		if f.v != nil {
			parts = append(parts, fmt.Sprintf("%s %g", f.name, *f.v))
		}
	}
	if g.TopK != nil {
		parts = append(parts, fmt.Sprintf("top_k %d", *g.TopK))
	}
	if g.MaxNewTokens != nil {
		parts = append(parts, fmt.Sprintf("max_new_tokens %d", *g.MaxNewTokens))
	}
	return strings.Join(parts, ", ")
}

func commas(n int64) string {
	s := fmt.Sprint(n)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// mixString lists, for a file whose tensors are not all of one dtype, each
// kind of matrix with its dtypes, e.g. "attn_v.weight Q4_K x6 Q6_K x6".
func (d *Description) mixString() string {
	if len(d.DTypes) < 2 || d.Mix == nil {
		return ""
	}
	kinds := make([]string, 0, len(d.Mix))
	for k := range d.Mix {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	var parts []string
	for _, k := range kinds {
		types := make([]string, 0, len(d.Mix[k]))
		for t := range d.Mix[k] {
			types = append(types, t)
		}
		slices.Sort(types)
		for i, t := range types {
			types[i] = fmt.Sprintf("%s x%d", t, d.Mix[k][t])
		}
		parts = append(parts, k+" "+strings.Join(types, " "))
	}
	return strings.Join(parts, "; ")
}
