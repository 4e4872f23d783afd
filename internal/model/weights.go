package model

import (
	"fmt"
	"hash/fnv"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels"
)

// Layer holds one transformer block's weights.
type Layer struct {
	AttnNorm            []float32
	Q, K, V, O          *kernels.Matrix
	QBias, KBias, VBias []float32
	// QNorm and KNorm (len HeadDim) normalise each head of q and k before
	// RoPE (Qwen3); nil when the model has none.
	QNorm, KNorm   []float32
	FFNNorm        []float32
	Gate, Up, Down *kernels.Matrix
	// Router (Experts rows) scores the experts for each token, and Experts
	// are their FFNs, in a mixture of experts (Gate, Up and Down are nil
	// then). A GGUF's experts are views into the layer's one tensor of
	// each kind, so nothing is copied to run one.
	Router  *kernels.Matrix
	Experts []Expert
}

// Expert is one expert's SwiGLU FFN: the backend's type, so that a
// layer's Experts are what an ExpertRunner takes, with nothing to convert
// per step.
type Expert = kernels.Expert

// ffnMatrices are the layer's FFN matrices, dense or experts'.
func (l *Layer) ffnMatrices() []*kernels.Matrix {
	if l.Router == nil {
		return []*kernels.Matrix{l.Gate, l.Up, l.Down}
	}
	ms := []*kernels.Matrix{l.Router}
	for _, e := range l.Experts {
		ms = append(ms, e.Gate, e.Up, e.Down)
	}
	return ms
}

// Weights holds every tensor of a model. Matrices may point into a memory
// mapped file; norms and biases are small and kept as float32 copies.
type Weights struct {
	Embed   *kernels.Matrix
	OutNorm []float32
	Output  *kernels.Matrix
	Layers  []Layer
}

// vectors are the weight vectors the backend reads (the norms).
func (w *Weights) vectors() [][]float32 {
	vs := [][]float32{w.OutNorm}
	for i := range w.Layers {
		l := &w.Layers[i]
		vs = append(vs, l.AttnNorm, l.FFNNorm, l.QNorm, l.KNorm)
	}
	return vs
}

// matrices are the weight matrices (Output may be Embed again).
func (w *Weights) matrices() []*kernels.Matrix {
	var ms []*kernels.Matrix
	w.eachMatrix(func(_ string, m *kernels.Matrix) { ms = append(ms, m) })
	return ms
}

// eachMatrix calls f on every matrix with its name as a GGUF file names
// it (an expert's: its layer's 3-D tensor and the expert's index).
func (w *Weights) eachMatrix(f func(name string, m *kernels.Matrix)) {
	f("token_embd.weight", w.Embed)
	f("output.weight", w.Output)
	for i := range w.Layers {
		l := &w.Layers[i]
		at := func(n string) string { return fmt.Sprintf("blk.%d.%s.weight", i, n) }
		f(at("attn_q"), l.Q)
		f(at("attn_k"), l.K)
		f(at("attn_v"), l.V)
		f(at("attn_output"), l.O)
		if l.Router == nil {
			f(at("ffn_gate"), l.Gate)
			f(at("ffn_up"), l.Up)
			f(at("ffn_down"), l.Down)
			continue
		}
		f(at("ffn_gate_inp"), l.Router)
		for e, ex := range l.Experts {
			f(fmt.Sprintf("%s[%d]", at("ffn_gate_exps"), e), ex.Gate)
			f(fmt.Sprintf("%s[%d]", at("ffn_up_exps"), e), ex.Up)
			f(fmt.Sprintf("%s[%d]", at("ffn_down_exps"), e), ex.Down)
		}
	}
}

// Params counts the parameters.
func (w *Weights) Params() int64 {
	n := int64(0)
	mat := func(m *kernels.Matrix) {
		if m != nil {
			n += int64(m.Rows) * int64(m.Cols)
		}
	}
	mat(w.Embed)
	if w.Output != w.Embed {
		mat(w.Output)
	}
	n += int64(len(w.OutNorm))
	for _, l := range w.Layers {
		for _, m := range append([]*kernels.Matrix{l.Q, l.K, l.V, l.O}, l.ffnMatrices()...) {
			mat(m)
		}
		n += int64(len(l.AttnNorm) + len(l.FFNNorm) + len(l.QBias) + len(l.KBias) + len(l.VBias) + len(l.QNorm) + len(l.KNorm))
	}
	return n
}

// Bytes is the memory the weights take (a tied output matrix counted once).
func (w *Weights) Bytes() int64 {
	var n int64
	seen := map[*kernels.Matrix]bool{}
	for _, m := range w.matrices() {
		if m != nil && !seen[m] {
			seen[m] = true
			n += int64(len(m.Data))
		}
	}
	for _, v := range w.vectors() {
		n += 4 * int64(len(v))
	}
	for _, l := range w.Layers {
		n += 4 * int64(len(l.QBias)+len(l.KBias)+len(l.VBias))
	}
	return n
}

// DType is the dtype of the bulk of the weights (the attention Q matrix).
func (w *Weights) DType() kernels.DType { return w.Layers[0].Q.DType }

func dtypeOf(t gguf.Type) (kernels.DType, error) {
	switch t {
	case gguf.TypeF32:
		return kernels.F32, nil
	case gguf.TypeF16:
		return kernels.F16, nil
	case gguf.TypeQ8_0:
		return kernels.Q8_0, nil
	case gguf.TypeBF16:
		return kernels.BF16, nil
	case gguf.TypeQ4_0:
		return kernels.Q4_0, nil
	case gguf.TypeQ4_1:
		return kernels.Q4_1, nil
	case gguf.TypeQ5_0:
		return kernels.Q5_0, nil
	case gguf.TypeQ5_1:
		return kernels.Q5_1, nil
	case gguf.TypeQ4_K:
		return kernels.Q4_K, nil
	case gguf.TypeQ5_K:
		return kernels.Q5_K, nil
	case gguf.TypeQ6_K:
		return kernels.Q6_K, nil
	case gguf.TypeQ3_K:
		return kernels.Q3_K, nil
	case gguf.TypeQ2_K:
		return kernels.Q2_K, nil
	}
	return 0, fmt.Errorf("tensor type %s is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K are)", t)
}

type ggufLoader struct {
	f        *gguf.File
	progress func(done, total int)
	done     int
}

func (l *ggufLoader) matrix(name string, rows, cols int) (*kernels.Matrix, error) {
	ti, data, err := l.f.Tensor(name)
	if err != nil {
		return nil, err
	}
	l.tick()
	if len(ti.Dims) != 2 || ti.Dims[0] != int64(cols) || ti.Dims[1] != int64(rows) {
		return nil, fmt.Errorf("model: tensor %s has shape %v, want [%d %d]", name, ti.Dims, cols, rows)
	}
	dt, err := dtypeOf(ti.Type)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", name, err)
	}
	m := &kernels.Matrix{DType: dt, Rows: rows, Cols: cols, Data: data}
	return m, m.Validate()
}

// experts maps a 3-D tensor [n][rows][cols] (ggml's [cols, rows, n]) as n
// matrices, each a view of its expert's part of the mapping.
func (l *ggufLoader) experts(pattern string, layer, n, rows, cols int) ([]*kernels.Matrix, error) {
	name := fmt.Sprintf(pattern, layer)
	ti, data, err := l.f.Tensor(name)
	if err != nil {
		return nil, err
	}
	l.tick()
	if len(ti.Dims) != 3 || ti.Dims[0] != int64(cols) || ti.Dims[1] != int64(rows) || ti.Dims[2] != int64(n) {
		return nil, fmt.Errorf("model: tensor %s has shape %v, want [%d %d %d]", name, ti.Dims, cols, rows, n)
	}
	dt, err := dtypeOf(ti.Type)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", name, err)
	}
	return expertViews(name, dt, data, n, rows, cols)
}

// expertViews splits the data of n stacked rows×cols matrices into views.
func expertViews(name string, dt kernels.DType, data []byte, n, rows, cols int) ([]*kernels.Matrix, error) {
	if bs := dt.BlockSize(); cols%bs != 0 {
		return nil, fmt.Errorf("model: %s: %s rows of %d (not a multiple of %d)", name, dt, cols, bs)
	}
	size := dt.RowBytes(cols) * rows
	if len(data) != size*n {
		return nil, fmt.Errorf("model: tensor %s holds %d bytes, want %d", name, len(data), size*n)
	}
	out := make([]*kernels.Matrix, n)
	for e := range out {
		out[e] = &kernels.Matrix{DType: dt, Rows: rows, Cols: cols, Data: data[e*size : (e+1)*size : (e+1)*size]}
		if err := out[e].Validate(); err != nil {
			return nil, fmt.Errorf("model: %s expert %d: %w", name, e, err)
		}
	}
	return out, nil
}

func (l *ggufLoader) vector(name string, n int) ([]float32, error) {
	ti, data, err := l.f.Tensor(name)
	if err != nil {
		return nil, err
	}
	l.tick()
	if ti.Elements() != int64(n) {
		return nil, fmt.Errorf("model: tensor %s has %d elements, want %d", name, ti.Elements(), n)
	}
	dt, err := dtypeOf(ti.Type)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", name, err)
	}
	return vectorOf(dt, n, data)
}

// vectorOf copies a tensor of n elements of dtype dt to float32: norms and
// biases are small and read on every step, so they are not left mapped.
func vectorOf(dt kernels.DType, n int, data []byte) ([]float32, error) {
	m := &kernels.Matrix{DType: dt, Rows: 1, Cols: n, Data: data}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	out := make([]float32, n)
	m.Row(0, out)
	return out, nil
}

func (l *ggufLoader) tick() {
	l.done++
	if l.progress != nil {
		l.progress(l.done, len(l.f.Tensors))
	}
}

// WeightsFromGGUF maps a GGUF file's tensors into Weights without copying matrices.
// progress, when set, is called after each tensor.
func WeightsFromGGUF(f *gguf.File, c *Config, progress func(done, total int)) (*Weights, error) {
	l := &ggufLoader{f: f, progress: progress}
	w := &Weights{}
	var err error
	if w.Embed, err = l.matrix("token_embd.weight", c.Vocab, c.Dim); err != nil {
		return nil, err
	}
	if w.OutNorm, err = l.vector("output_norm.weight", c.Dim); err != nil {
		return nil, err
	}
	if f.HasTensor("output.weight") {
		if w.Output, err = l.matrix("output.weight", c.Vocab, c.Dim); err != nil {
			return nil, err
		}
	} else {
		w.Output = w.Embed // tied embeddings
	}
	if f.HasTensor("rope_freqs.weight") {
		if c.RoPE.Factors, err = l.vector("rope_freqs.weight", c.RoPE.Dim/2); err != nil {
			return nil, err
		}
	}
	for i := 0; i < c.Layers; i++ {
		ly, err := loadLayer(l, ggufLayerNames, c, i)
		if err != nil {
			return nil, err
		}
		w.Layers = append(w.Layers, ly)
	}
	return w, nil
}

// tensorSource is what loading a layer needs from a file format.
type tensorSource interface {
	matrix(name string, rows, cols int) (*kernels.Matrix, error)
	vector(name string, n int) ([]float32, error)
	// experts gives layer's n expert matrices of one kind (pattern is
	// the format's name for them, see layerNames).
	experts(pattern string, layer, n, rows, cols int) ([]*kernels.Matrix, error)
}

// layerNames are one format's tensor names for a layer's weights, each with
// a %d for the layer index. The expert names (expGate, expUp, expDown) are
// the format's: GGUF's one tensor per layer, or a Hugging Face
// checkpoint's one per expert with a second %d for the expert.
type layerNames struct {
	attnNorm, q, k, v, o, ffnNorm, gate, up, down string
	qBias, kBias, vBias, qNorm, kNorm             string
	router, expGate, expUp, expDown               string
}

var ggufLayerNames = layerNames{
	attnNorm: "blk.%d.attn_norm.weight", q: "blk.%d.attn_q.weight", k: "blk.%d.attn_k.weight", v: "blk.%d.attn_v.weight",
	o: "blk.%d.attn_output.weight", ffnNorm: "blk.%d.ffn_norm.weight", gate: "blk.%d.ffn_gate.weight", up: "blk.%d.ffn_up.weight",
	down: "blk.%d.ffn_down.weight", qBias: "blk.%d.attn_q.bias", kBias: "blk.%d.attn_k.bias", vBias: "blk.%d.attn_v.bias",
	qNorm: "blk.%d.attn_q_norm.weight", kNorm: "blk.%d.attn_k_norm.weight",
	router: "blk.%d.ffn_gate_inp.weight", expGate: "blk.%d.ffn_gate_exps.weight", expUp: "blk.%d.ffn_up_exps.weight",
	expDown: "blk.%d.ffn_down_exps.weight",
}

// loadLayer reads layer i's weights with the shapes c gives.
func loadLayer(src tensorSource, n layerNames, c *Config, i int) (Layer, error) {
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	name := func(f string) string { return fmt.Sprintf(f, i) }
	var ly Layer
	steps := []func() error{
		func() (e error) { ly.AttnNorm, e = src.vector(name(n.attnNorm), c.Dim); return },
		func() (e error) { ly.Q, e = src.matrix(name(n.q), qd, c.Dim); return },
		func() (e error) { ly.K, e = src.matrix(name(n.k), kvd, c.Dim); return },
		func() (e error) { ly.V, e = src.matrix(name(n.v), kvd, c.Dim); return },
		func() (e error) { ly.O, e = src.matrix(name(n.o), c.Dim, qd); return },
		func() (e error) { ly.FFNNorm, e = src.vector(name(n.ffnNorm), c.Dim); return },
	}
	if c.Experts == 0 {
		steps = append(steps,
			func() (e error) { ly.Gate, e = src.matrix(name(n.gate), c.FF, c.Dim); return },
			func() (e error) { ly.Up, e = src.matrix(name(n.up), c.FF, c.Dim); return },
			func() (e error) { ly.Down, e = src.matrix(name(n.down), c.Dim, c.FF); return })
	} else {
		var gate, up, down []*kernels.Matrix
		steps = append(steps,
			func() (e error) { ly.Router, e = src.matrix(name(n.router), c.Experts, c.Dim); return },
			func() (e error) { gate, e = src.experts(n.expGate, i, c.Experts, c.FF, c.Dim); return },
			func() (e error) { up, e = src.experts(n.expUp, i, c.Experts, c.FF, c.Dim); return },
			func() (e error) { down, e = src.experts(n.expDown, i, c.Experts, c.Dim, c.FF); return },
			func() error {
				ly.Experts = make([]Expert, c.Experts)
				for e := range ly.Experts {
					ly.Experts[e] = Expert{Gate: gate[e], Up: up[e], Down: down[e]}
				}
				return nil
			})
	}
	if c.QKVBias {
		steps = append(steps,
			func() (e error) { ly.QBias, e = src.vector(name(n.qBias), qd); return },
			func() (e error) { ly.KBias, e = src.vector(name(n.kBias), kvd); return },
			func() (e error) { ly.VBias, e = src.vector(name(n.vBias), kvd); return })
	}
	if c.QKNorm {
		steps = append(steps,
			func() (e error) { ly.QNorm, e = src.vector(name(n.qNorm), c.HeadDim); return },
			func() (e error) { ly.KNorm, e = src.vector(name(n.kNorm), c.HeadDim); return })
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return Layer{}, err
		}
	}
	return ly, nil
}

// DummyWeights makes deterministic pseudo-random weights of shape c in
// dtype dt: the same config always gives the same weights, so benchmarks
// and tests are repeatable without a checkpoint.
func DummyWeights(c *Config, dt kernels.DType) (*Weights, error) {
	return DummyWeightsMixed(c, func(string) kernels.DType { return dt })
}

// DummyWeightsMixed makes DummyWeights' values with each matrix in the
// dtype pick chooses for its kind (Requantize's kinds; an expert's are
// ffn_gate, ffn_up and ffn_down, the router's ffn_gate_inp), as a
// quantised file mixes formats (Q4KM). Each matrix is encoded once from
// the values, so a mix costs no more to make than one dtype.
func DummyWeightsMixed(c *Config, pick func(kind string) kernels.DType) (*Weights, error) {
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	w := &Weights{OutNorm: ones(c.Dim)}
	type job struct {
		dst        **kernels.Matrix
		name, kind string
		rows, cols int
	}
	jobs := []job{{&w.Embed, "token_embd", "token_embd", c.Vocab, c.Dim}}
	if !c.TieEmbeddings {
		jobs = append(jobs, job{&w.Output, "output", "output", c.Vocab, c.Dim})
	}
	w.Layers = make([]Layer, c.Layers)
	for i := range w.Layers {
		ly := &w.Layers[i]
		ly.AttnNorm, ly.FFNNorm = ones(c.Dim), ones(c.Dim)
		if c.QKVBias {
			ly.QBias, ly.KBias, ly.VBias = make([]float32, qd), make([]float32, kvd), make([]float32, kvd)
		}
		if c.QKNorm {
			ly.QNorm, ly.KNorm = ones(c.HeadDim), ones(c.HeadDim)
		}
		p := fmt.Sprintf("blk.%d.", i)
		jobs = append(jobs, job{&ly.Q, p + "q", "attn_q", qd, c.Dim}, job{&ly.K, p + "k", "attn_k", kvd, c.Dim},
			job{&ly.V, p + "v", "attn_v", kvd, c.Dim}, job{&ly.O, p + "o", "attn_output", c.Dim, qd})
		if c.Experts == 0 {
			jobs = append(jobs, job{&ly.Gate, p + "gate", "ffn_gate", c.FF, c.Dim}, job{&ly.Up, p + "up", "ffn_up", c.FF, c.Dim},
				job{&ly.Down, p + "down", "ffn_down", c.Dim, c.FF})
			continue
		}
		jobs = append(jobs, job{&ly.Router, p + "router", "ffn_gate_inp", c.Experts, c.Dim})
		ly.Experts = make([]Expert, c.Experts)
		for e := range ly.Experts {
			ex, q := &ly.Experts[e], fmt.Sprintf("%sexpert.%d.", p, e)
			jobs = append(jobs, job{&ex.Gate, q + "gate", "ffn_gate", c.FF, c.Dim}, job{&ex.Up, q + "up", "ffn_up", c.FF, c.Dim},
				job{&ex.Down, q + "down", "ffn_down", c.Dim, c.FF})
		}
	}
	for _, j := range jobs {
		if dt := pick(j.kind); j.cols%dt.BlockSize() != 0 {
			return nil, fmt.Errorf("model: %s dummy weights need dimensions that are multiples of %d (%s has %d columns)", dt, dt.BlockSize(), j.kind, j.cols)
		}
	}
	// The block formats encode slowly (Q4_K searches each block's scale):
	// every core takes matrices, each one's values drawn in order from its
	// own seed.
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(4, runtime.GOMAXPROCS(0)))
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			*j.dst = dummyMatrix(j.name, j.rows, j.cols, pick(j.kind))
		}()
	}
	wg.Wait()
	if c.TieEmbeddings {
		w.Output = w.Embed
	}
	return w, nil
}

func ones(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// dummyMatrix fills a matrix with uniform values in ±1/sqrt(cols), which keeps
// activations of a deep random network in a sane range.
func dummyMatrix(name string, rows, cols int, dt kernels.DType) *kernels.Matrix {
	h := fnv.New64a()
	h.Write([]byte(name))
	state := h.Sum64() | 1
	next := func() float32 { // xorshift64*: fast and deterministic
		state ^= state >> 12
		state ^= state << 25
		state ^= state >> 27
		return float32((state*2685821657736338717)>>40)/float32(1<<24)*2 - 1
	}
	amp := float32(1 / math.Sqrt(float64(cols)))
	m := &kernels.Matrix{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, dt.RowBytes(cols)*rows)}
	row := make([]float32, cols)
	rb := dt.RowBytes(cols)
	for r := 0; r < rows; r++ {
		for i := range row {
			row[i] = next() * amp
		}
		kernels.EncodeRow(m.Data[r*rb:(r+1)*rb], row, dt)
	}
	return m
}

// Q4KM is the mix of a Q4_K_M file as llama.cpp's quantiser makes it,
// simplified to every layer alike: Q6_K for attn_v, ffn_down and the
// output, Q4_K elsewhere. A pick for Requantize and DummyWeightsMixed.
func Q4KM(kind string) kernels.DType {
	switch kind {
	case "attn_v", "ffn_down", "output":
		return kernels.Q6_K
	}
	return kernels.Q4_K
}

// Requantize re-encodes every dense matrix of w (not experts') in the dtype pick chooses
// for its kind ("attn_v", "ffn_down", "token_embd", ...), as a quantiser
// mixes formats in one file (Q4_K_M's Q6_K for attn_v and ffn_down): for
// tests and benchmarks of the formats on models made in memory. Each matrix
// is replaced, so tied embeddings part (Output gets its own kind).
func (w *Weights) Requantize(pick func(kind string) kernels.DType) {
	type part struct {
		src, dst *kernels.Matrix
		r0, r1   int
	}
	var parts []part
	conv := func(m **kernels.Matrix, kind string) {
		if *m == nil { // a mixture of experts' layer has no dense FFN
			return
		}
		src, dt := *m, pick(kind)
		out := &kernels.Matrix{DType: dt, Rows: src.Rows, Cols: src.Cols, Data: make([]byte, dt.RowBytes(src.Cols)*src.Rows)}
		// Spans of about a million values, so that the embedding (the
		// largest matrix by far) is shared out like the rest.
		step := max(1, (1<<20)/src.Cols)
		for r := 0; r < src.Rows; r += step {
			parts = append(parts, part{src, out, r, min(r+step, src.Rows)})
		}
		*m = out
	}
	conv(&w.Embed, "token_embd")
	conv(&w.Output, "output")
	for i := range w.Layers {
		ly := &w.Layers[i]
		for _, m := range []struct {
			p    **kernels.Matrix
			kind string
		}{{&ly.Q, "attn_q"}, {&ly.K, "attn_k"}, {&ly.V, "attn_v"}, {&ly.O, "attn_output"},
			{&ly.Gate, "ffn_gate"}, {&ly.Up, "ffn_up"}, {&ly.Down, "ffn_down"}} {
			conv(m.p, m.kind)
		}
	}
	// The K formats search each block's scales: one goroutine a core,
	// each taking the next span of rows.
	var next sync.Mutex
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var row []float32
			for {
				next.Lock()
				if len(parts) == 0 {
					next.Unlock()
					return
				}
				p := parts[0]
				parts = parts[1:]
				next.Unlock()
				row = slices.Grow(row[:0], p.src.Cols)[:p.src.Cols]
				rb := p.dst.DType.RowBytes(p.src.Cols)
				for r := p.r0; r < p.r1; r++ {
					p.src.Row(r, row)
					kernels.EncodeRow(p.dst.Data[r*rb:(r+1)*rb], row, p.dst.DType)
				}
			}
		}()
	}
	wg.Wait()
}
