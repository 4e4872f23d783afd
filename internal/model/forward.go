package model

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/batonlm/baton/internal/kernels"
)

// Model is a loaded model bound to a backend. Forward is not safe for
// concurrent use: one scheduler loop owns it.
type Model struct {
	Config  Config
	Weights *Weights
	be      kernels.Backend
	s       scratch
	closer  func() error
	// keptWeights: the weight vectors were handed to kernels.Keep.
	keptWeights bool
	// id tells this model's decode graphs from those of another model on
	// the same backend (a draft's); pad is the padded decode batch.
	id  uint64
	pad Batch
}

var modelIDs atomic.Uint64

// New binds weights to a backend.
func New(c Config, w *Weights, be kernels.Backend) *Model {
	return &Model{Config: c, Weights: w, be: be, id: modelIDs.Add(1)}
}

// stepGrapher is a backend that runs a decode step as one captured graph
// (the cuda backend's CUDA graphs): for a step of n rows GraphRows says
// how many rows to pad it to (0: none), and the step's calls go between
// BeginGraphStep and EndGraphStep. The padded rows repeat the last row
// (token, position, slot and pages), so they store the same K/V bytes
// into the same slot and their logits are not returned.
//
// EndGraphStep says whether the step was the first run of a graph just
// captured. That step is run again directly and the two logits compared:
// a graph that does not compute what its launches do (a capture the
// driver got wrong, a table captured by value) is turned off for its
// bucket with GraphWrong before any token is drawn from it, and the
// direct logits are the step's. Running the step twice is harmless: its
// K/V stores write the same bytes into the same slots.
type stepGrapher interface {
	GraphRows(owner uint64, n int) int
	BeginGraphStep(owner uint64, rows int)
	EndGraphStep() (fresh bool)
	GraphWrong(owner uint64, rows int, why string)
}

// graphable says whether a step may run as a graph: a decode step (a row
// a sequence, its last) whose logits stay on the device, of a model that
// never reads back mid-step (a mixture of experts routes on the host, a
// QKV bias is added there).
func (m *Model) graphable(b *Batch, device bool) bool {
	if !device || m.Config.Experts > 0 || len(b.Seqs) != len(b.Tokens) {
		return false
	}
	for i := range b.Seqs {
		if b.Rows(i) != 1 {
			return false
		}
	}
	for l := range m.Weights.Layers {
		if m.Weights.Layers[l].QBias != nil || m.Weights.Layers[l].Router != nil {
			return false
		}
	}
	return true
}

// padded is b with rows rows, the last repeated.
func (m *Model) padded(b *Batch, rows int) *Batch {
	p, n := &m.pad, len(b.Tokens)
	p.Tokens = append(p.Tokens[:0], b.Tokens...)
	p.Positions = append(p.Positions[:0], b.Positions...)
	p.Slots = append(p.Slots[:0], b.Slots...)
	p.Seqs = append(p.Seqs[:0], b.Seqs...)
	p.Every = nil
	for i := n; i < rows; i++ {
		last := b.Seqs[n-1]
		last.QStart = i
		p.Tokens = append(p.Tokens, b.Tokens[n-1])
		p.Positions = append(p.Positions, b.Positions[n-1])
		p.Slots = append(p.Slots, b.Slots[n-1])
		p.Seqs = append(p.Seqs, last)
	}
	return p
}

// Backend is the kernel backend the model runs on.
func (m *Model) Backend() kernels.Backend { return m.be }

// Close releases what the weights were loaded from (a file mapping).
func (m *Model) Close() error {
	if m.closer != nil {
		return m.closer()
	}
	return nil
}

// Batch is one forward step over several sequences. Token i of the batch has
// position Positions[i] and its K/V go to pool slot Slots[i]; Seqs say which
// rows belong to which sequence (see kernels.AttnSeq).
type Batch struct {
	Tokens    []int32
	Positions []int32
	Slots     []int32
	Seqs      []kernels.AttnSeq
	// Every, when set, has one entry per sequence; a true one asks for the
	// logits of all of its rows rather than the last (a prompt's own
	// logprobs need every position's prediction).
	Every []bool
}

// Rows is how many logit rows Forward returns for sequence i.
func (b *Batch) Rows(i int) int {
	if i < len(b.Every) && b.Every[i] {
		return b.Seqs[i].QLen
	}
	return 1
}

// Validate checks the batch is self-consistent before any kernel runs, so a
// scheduler bug shows as an error rather than as a read out of bounds.
func (b *Batch) Validate(c *Config, kv kernels.PagedKV) error {
	n := len(b.Tokens)
	if n == 0 || len(b.Positions) != n || len(b.Slots) != n || len(b.Seqs) == 0 {
		return fmt.Errorf("model: malformed batch (%d tokens, %d positions, %d slots, %d seqs)", n, len(b.Positions), len(b.Slots), len(b.Seqs))
	}
	for _, t := range b.Tokens {
		if t < 0 || int(t) >= c.Vocab {
			return fmt.Errorf("model: token %d outside vocabulary of %d", t, c.Vocab)
		}
	}
	total := kv.PageSize * kv.Pages()
	for _, s := range b.Slots {
		if s < 0 || int(s) >= total {
			return fmt.Errorf("model: slot %d outside the pool", s)
		}
	}
	rows := 0
	for _, s := range b.Seqs {
		if s.QStart != rows || s.QLen <= 0 || s.KVLen < s.QLen || (s.KVLen+kv.PageSize-1)/kv.PageSize > len(s.Pages) {
			return fmt.Errorf("model: malformed sequence %+v", s)
		}
		rows += s.QLen
	}
	if rows != n {
		return fmt.Errorf("model: sequences cover %d rows of %d", rows, n)
	}
	if b.Every != nil && len(b.Every) != len(b.Seqs) {
		return fmt.Errorf("model: %d Every entries for %d sequences", len(b.Every), len(b.Seqs))
	}
	return nil
}

type scratch struct {
	x, h, q, k, v, attn, o, gate, up, last, logits []float32
	lastRows                                       []int32 // the rows of x that give logits
	moe                                            moeScratch
}

// grow returns s with length n, reallocated when it has no room; the old
// slice's copy in the backend's memory (if kept) goes at once rather than
// when the collector gets to it.
func (m *Model) grow(s []float32, n int) []float32 {
	if cap(s) < n {
		if cap(s) > 0 {
			kernels.Forget(m.be, s)
		}
		return make([]float32, n)
	}
	return s[:n]
}

// size sets the scratch's lengths for a step of n rows with ns logit rows
// (ns <= n), growing what is too small.
func (m *Model) size(n, ns int) {
	c, s := &m.Config, &m.s
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	s.x, s.h = m.grow(s.x, n*c.Dim), m.grow(s.h, n*c.Dim)
	s.q, s.attn = m.grow(s.q, n*qd), m.grow(s.attn, n*qd)
	s.k, s.v = m.grow(s.k, n*kvd), m.grow(s.v, n*kvd)
	s.o = m.grow(s.o, n*c.Dim)
	s.gate, s.up = m.grow(s.gate, n*c.FF), m.grow(s.up, n*c.FF)
	s.last, s.logits = m.grow(s.last, ns*c.Dim), m.grow(s.logits, ns*c.Vocab)
	if c.Experts > 0 {
		s.moe.size(c, n)
	}
}

// Reserve sizes the scratch for steps of up to rows rows and seqs logit
// rows, so that a serving loop allocates it once, before its first step,
// instead of again at each step larger than all before it. Memory fresh
// from the OS faults a page at a time on first touch: in a 32-stream run
// of the 134M, where steps grew from 512 rows to 544 and from 4 logit rows
// to 32, those growths took half of 68,000 page faults (with the cpu
// backend's attention slices, 68,000 -> 18,500 a run).
func (m *Model) Reserve(rows, seqs int) {
	if rows > 0 {
		m.size(rows, min(seqs, rows))
	}
}

// Forward runs the batch and returns the logits of the last row of each
// sequence (all its rows where Every says so), in sequence order, each
// Vocab long, valid until the next call.
func (m *Model) Forward(b *Batch, kv kernels.PagedKV) ([]float32, error) {
	return m.forward(b, kv, false)
}

// ForwardDevice is Forward leaving the logits where the backend computed
// them when it samples there (a kernels.RowSampler): the host slice is then
// stale until kernels.Host brings it, so a caller that samples every row
// on the device copies none of them. On other backends it is Forward.
func (m *Model) ForwardDevice(b *Batch, kv kernels.PagedKV) ([]float32, error) {
	return m.forward(b, kv, true)
}

func (m *Model) forward(b *Batch, kv kernels.PagedKV, device bool) ([]float32, error) {
	c := &m.Config
	if err := b.Validate(c, kv); err != nil {
		return nil, err
	}
	if g, ok := m.be.(stepGrapher); ok && m.graphable(b, device) {
		n := len(b.Tokens)
		if rows := g.GraphRows(m.id, n); rows >= n {
			p := m.padded(b, rows)
			g.BeginGraphStep(m.id, rows)
			logits := m.run(p, kv, device)
			if !g.EndGraphStep() {
				return logits[:n*c.Vocab], nil
			}
			kernels.Host(m.be, logits)
			graphed := append([]float32(nil), logits[:n*c.Vocab]...)
			logits = m.run(p, kv, device)
			kernels.Host(m.be, logits)
			if i, ok := sameLogits(graphed, logits[:n*c.Vocab]); !ok {
				g.GraphWrong(m.id, rows, fmt.Sprintf("its first replay gave logit %d = %g, the direct launches %g", i, graphed[i], logits[i]))
			}
			return logits[:n*c.Vocab], nil
		}
	}
	return m.run(b, kv, device), nil
}

// run is forward of a valid batch.
func (m *Model) run(b *Batch, kv kernels.PagedKV, device bool) []float32 {
	c := &m.Config
	be, w, s := m.be, m.Weights, &m.s
	n, ns := len(b.Tokens), 0
	for i := range b.Seqs {
		ns += b.Rows(i)
	}
	m.size(n, ns)
	// On a backend that keeps activations in its own memory (a GPU's) the
	// layers run there; the host reads s.x back only for the last rows.
	kernels.Keep(be, s.x, s.h, s.q, s.k, s.v, s.attn, s.o, s.gate, s.up, s.last)
	// The logits stay on the device for a caller that samples them there;
	// any other gets exactly its rows copied out by the LM head's product.
	if _, ok := be.(kernels.RowSampler); ok && device {
		kernels.Keep(be, s.logits)
	} else {
		kernels.Forget(be, s.logits)
	}
	if !m.keptWeights {
		kernels.Keep(be, w.vectors()...)
		m.keptWeights = true
	}

	be.Embed(s.x, w.Embed, b.Tokens)
	scale := float32(1 / math.Sqrt(float64(c.HeadDim)))
	for l := range w.Layers {
		ly := &w.Layers[l]
		// The residual of the layer before (its FFN's output, in s.o) is
		// added as this layer's norm reads the rows.
		if l == 0 {
			be.RMSNorm(s.h, s.x, ly.AttnNorm, n, c.NormEps)
		} else {
			kernels.AddRMSNorm(be, s.h, s.x, s.o, ly.AttnNorm, n, c.NormEps)
		}
		be.MatMul(s.q, s.h, n, ly.Q)
		be.MatMul(s.k, s.h, n, ly.K)
		be.MatMul(s.v, s.h, n, ly.V)
		if ly.QBias != nil {
			kernels.Host(be, s.q, s.k, s.v)
			addBias(s.q, ly.QBias)
			addBias(s.k, ly.KBias)
			addBias(s.v, ly.VBias)
			kernels.Changed(be, s.q, s.k, s.v)
		}
		if ly.QNorm != nil {
			// Per-head RMSNorm: each head is a row of HeadDim.
			be.RMSNorm(s.q, s.q, ly.QNorm, n*c.Heads, c.NormEps)
			be.RMSNorm(s.k, s.k, ly.KNorm, n*c.KVHeads, c.NormEps)
		}
		kernels.RoPEStoreKV(be, s.q, s.k, s.v, b.Positions, c.Heads, c.RoPE, kv, l, b.Slots)
		be.Attention(s.attn, s.q, kv, l, b.Seqs, c.Heads, scale)
		be.MatMul(s.o, s.attn, n, ly.O)
		kernels.AddRMSNorm(be, s.h, s.x, s.o, ly.FFNNorm, n, c.NormEps)
		if ly.Router != nil {
			m.experts(ly, n)
		} else {
			be.MatMul(s.gate, s.h, n, ly.Gate)
			be.MatMul(s.up, s.h, n, ly.Up)
			be.SwiGLU(s.gate, s.gate, s.up)
			be.MatMul(s.o, s.gate, n, ly.Down)
		}
	}
	be.Add(s.x, s.x, s.o) // the last layer's residual
	// The logit rows: every row of a decode step in order, else the rows
	// gathered (where the step's rows are, on a GPU).
	s.lastRows = s.lastRows[:0]
	for i, sq := range b.Seqs {
		k := b.Rows(i)
		for r := sq.QStart + sq.QLen - k; r < sq.QStart+sq.QLen; r++ {
			s.lastRows = append(s.lastRows, int32(r))
		}
	}
	last := s.x[:ns*c.Dim]
	if !allInOrder(s.lastRows, n) {
		kernels.GatherRows(be, s.last, s.x, c.Dim, s.lastRows)
		last = s.last
	}
	be.RMSNorm(s.h[:ns*c.Dim], last, w.OutNorm, ns, c.NormEps)
	be.MatMul(s.logits, s.h[:ns*c.Dim], ns, w.Output)
	return s.logits
}

// allInOrder says whether rows is 0, 1, ..., n-1.
func allInOrder(rows []int32, n int) bool {
	if len(rows) != n {
		return false
	}
	for i, r := range rows {
		if int(r) != i {
			return false
		}
	}
	return true
}

func addBias(x, bias []float32) {
	for i := 0; i < len(x); i += len(bias) {
		row := x[i : i+len(bias)]
		for j, b := range bias {
			row[j] += b
		}
	}
}

// sameLogits compares a graph's logits with direct launches': equal to
// 1e-5 of the larger magnitude (the same kernels on the same inputs; the
// margin only absorbs a reduction order a driver may pick per launch).
// A NaN on one side and not the other differs. It returns the first
// index that differs.
func sameLogits(graphed, direct []float32) (int, bool) {
	for i := range graphed {
		a, b := float64(graphed[i]), float64(direct[i])
		if math.IsNaN(a) != math.IsNaN(b) {
			return i, false
		}
		if d := math.Abs(a - b); d > 1e-5*max(math.Abs(a), math.Abs(b), 1) {
			return i, false
		}
	}
	return 0, true
}
