package model

import (
	"math"

	"github.com/batonlm/baton/internal/kernels"
)

// moeScratch is a mixture-of-experts layer's working memory. Its buffers
// are not kept in a backend's memory: the routing runs on the host, and
// so do the gather and scatter of rows on a backend that is not an
// ExpertRunner.
type moeScratch struct {
	logits []float32 // n × Experts router logits
	in     []float32 // the rows one expert runs on, gathered
	out    []float32 // that expert's output rows
	// pick[i*k+j] and weight[i*k+j] are row i's j-th chosen expert and its
	// weight; rows[e] lists the picks (i*k+j) of expert e this layer.
	pick   []int32
	weight []float32
	rows   [][]int32
	taken  []bool
}

func (s *moeScratch) size(c *Config, n int) {
	fit := func(b []float32, n int) []float32 {
		if cap(b) < n {
			return make([]float32, n)
		}
		return b[:n]
	}
	s.logits, s.in, s.out = fit(s.logits, n*c.Experts), fit(s.in, n*c.Dim), fit(s.out, n*c.Dim)
	s.weight = fit(s.weight, n*c.ExpertsUsed)
	if cap(s.pick) < n*c.ExpertsUsed {
		s.pick = make([]int32, n*c.ExpertsUsed)
	}
	s.pick = s.pick[:n*c.ExpertsUsed]
	if len(s.rows) != c.Experts {
		s.rows, s.taken = make([][]int32, c.Experts), make([]bool, c.Experts)
	}
}

// route chooses each row's experts from its router logits: the k largest,
// ties going to the lower index (as torch.topk and llama.cpp's argsort
// pick them), weighted by a softmax over the chosen logits when norm is
// set and otherwise by their probability under a softmax over all of them.
// The two are what transformers computes for Mixtral (softmax, top-k,
// renormalise) and for Qwen3-MoE (the same, renormalising only with
// norm_topk_prob), without the rounding of a softmax taken twice.
// taken is scratch of len experts.
func route(logits []float32, experts, k int, norm bool, pick []int32, weight []float32, taken []bool) {
	n := len(logits) / experts
	for i := range n {
		row := logits[i*experts : (i+1)*experts]
		p, w := pick[i*k:(i+1)*k], weight[i*k:(i+1)*k]
		clear(taken)
		for j := range p {
			best := -1
			for e, v := range row {
				if !taken[e] && (best < 0 || v > row[best] || math.IsNaN(float64(row[best]))) {
					best = e
				}
			}
			taken[best] = true
			p[j] = int32(best)
		}
		top := float64(row[p[0]])
		var sum float64
		if norm {
			for _, e := range p {
				sum += math.Exp(float64(row[e]) - top)
			}
		} else {
			for _, v := range row {
				sum += math.Exp(float64(v) - top)
			}
		}
		for j, e := range p {
			w[j] = float32(math.Exp(float64(row[e])-top) / sum)
		}
	}
}

// experts runs a mixture-of-experts FFN on the n rows of s.h into s.o.
// Rows are grouped by expert, so that each expert chosen by any row of the
// step has its weights read once, by one product over its rows. Only the
// router's logits come to the host: a backend that runs the experts itself
// (kernels.ExpertRunner) gets the routing and keeps the rows where they
// are; on any other the rows are gathered and scattered here.
func (m *Model) experts(ly *Layer, n int) {
	c, be, s := &m.Config, m.be, &m.s
	ms := &s.moe
	k, d := c.ExpertsUsed, c.Dim
	be.MatMul(ms.logits, s.h, n, ly.Router)
	route(ms.logits, c.Experts, k, c.ExpertNorm, ms.pick, ms.weight, ms.taken)
	if er, ok := be.(kernels.ExpertRunner); ok {
		er.Experts(s.o[:n*d], s.h[:n*d], n, ly.Experts, ms.pick, ms.weight, k)
		return
	}
	for e := range ms.rows {
		ms.rows[e] = ms.rows[e][:0]
	}
	for i, e := range ms.pick {
		ms.rows[e] = append(ms.rows[e], int32(i))
	}
	kernels.Host(be, s.h)
	out := s.o[:n*d]
	clear(out)
	for e, picks := range ms.rows {
		r := len(picks)
		if r == 0 {
			continue
		}
		for j, p := range picks {
			i := int(p) / k
			copy(ms.in[j*d:(j+1)*d], s.h[i*d:(i+1)*d])
		}
		ex := &ly.Experts[e]
		g, u := s.gate[:r*c.FF], s.up[:r*c.FF]
		be.MatMul(g, ms.in[:r*d], r, ex.Gate)
		be.MatMul(u, ms.in[:r*d], r, ex.Up)
		be.SwiGLU(g, g, u)
		be.MatMul(ms.out[:r*d], g, r, ex.Down)
		for j, p := range picks {
			i, w := int(p)/k, ms.weight[p]
			dst, src := out[i*d:(i+1)*d], ms.out[j*d:(j+1)*d]
			for x, v := range src {
				dst[x] += w * v
			}
		}
	}
	kernels.Changed(be, s.o)
}
