package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

// moeCase is an Experts call: 8 experts of dim 64 and ffn 96, k = 2 a
// row; expert 7 is never chosen, and every other row chooses expert 0, so
// 40 rows give it a segment of 20 (cuBLAS, or 8-row chunks without it).
type moeCase struct {
	n, k, d, ff int
	experts     []kernels.Expert
	x           []float32
	pick        []int32
	weight      []float32
}

func newMoECase(rng *rand.Rand, dt kernels.DType, n int) moeCase {
	c := moeCase{n: n, k: 2, d: 64, ff: 96}
	c.experts = make([]kernels.Expert, 8)
	for e := range c.experts {
		c.experts[e] = kernels.Expert{Gate: randMatrix(rng, dt, c.ff, c.d), Up: randMatrix(rng, dt, c.ff, c.d),
			Down: randMatrix(rng, dt, c.d, c.ff)}
	}
	c.x = randVec(rng, n*c.d, 0.5)
	for i := range n {
		a := int32(rng.IntN(7))
		if i%2 == 0 {
			a = 0
		}
		b := int32(rng.IntN(6))
		if b >= a {
			b++
		}
		w := float32(0.3 + 0.4*rng.Float64())
		c.pick = append(c.pick, a, b)
		c.weight = append(c.weight, w, 1-w)
	}
	return c
}

// want is the layer in float64 from the dequantised weights
// (Matrix.Row); mag is, for each output, Σ over its terms of
// |weight·down·h|, the scale its float32 error goes by.
func (c moeCase) want() (want, mag []float64) {
	row := func(m *kernels.Matrix, r int) []float32 {
		v := make([]float32, m.Cols)
		m.Row(r, v)
		return v
	}
	dot := func(a []float32, b []float32) (s, abs float64) {
		for i := range a {
			s += float64(a[i]) * float64(b[i])
			abs += math.Abs(float64(a[i]) * float64(b[i]))
		}
		return s, abs
	}
	want, mag = make([]float64, c.n*c.d), make([]float64, c.n*c.d)
	for i := range c.n {
		x := c.x[i*c.d : (i+1)*c.d]
		for j := range c.k {
			ex, w := c.experts[c.pick[i*c.k+j]], float64(c.weight[i*c.k+j])
			h := make([]float32, c.ff)
			hmag := make([]float64, c.ff)
			for f := range h {
				g, gm := dot(row(ex.Gate, f), x)
				u, um := dot(row(ex.Up, f), x)
				silu := g / (1 + math.Exp(-g))
				h[f] = float32(silu * u)
				hmag[f] = math.Abs(silu)*um + gm*math.Abs(u)
			}
			for o := range c.d {
				dr := row(ex.Down, o)
				s, _ := dot(dr, h)
				want[i*c.d+o] += w * s
				for f := range h {
					mag[i*c.d+o] += math.Abs(w * float64(dr[f]) * hmag[f])
				}
			}
		}
	}
	return want, mag
}

// hostPath is the layer as the model runs it on a backend that is no
// ExpertRunner: each chosen expert's products through MatMul and SwiGLU
// over its rows gathered on the host, the weighted sum in pick order;
// and for each output Σ|weight·y| over its terms.
func (c moeCase) hostPath(b *Backend) (out []float32, mag []float64) {
	ys := make([][]float32, len(c.pick))
	for e := range c.experts {
		var picks []int
		var in []float32
		for p, pe := range c.pick {
			if int(pe) == e {
				picks = append(picks, p)
				in = append(in, c.x[p/c.k*c.d:(p/c.k+1)*c.d]...)
			}
		}
		r := len(picks)
		if r == 0 {
			continue
		}
		g, u, y := make([]float32, r*c.ff), make([]float32, r*c.ff), make([]float32, r*c.d)
		b.MatMul(g, in, r, c.experts[e].Gate)
		b.MatMul(u, in, r, c.experts[e].Up)
		b.SwiGLU(g, g, u)
		b.MatMul(y, g, r, c.experts[e].Down)
		for j, p := range picks {
			ys[p] = y[j*c.d : (j+1)*c.d]
		}
	}
	out, mag = make([]float32, c.n*c.d), make([]float64, c.n*c.d)
	for i := range c.n {
		for o := range c.d {
			var acc float32
			for j := range c.k {
				acc += c.weight[i*c.k+j] * ys[i*c.k+j][o]
				mag[i*c.d+o] += math.Abs(float64(c.weight[i*c.k+j] * ys[i*c.k+j][o]))
			}
			out[i*c.d+o] = acc
		}
	}
	return out, mag
}

// Tolerances of Experts against the float64 layer, relative to the sum
// of the magnitudes of its terms (moeCase.want): float32 products as
// MatMul's, and with cuBLAS GemmEx (segments of more than 8 rows of f16
// or bf16 weights) x and h rounded to the weights' type. Against the
// backend's own MatMul products the result differs only by the order of
// the k-term sum (a GPU's fused multiply-add): tolMoEHost, relative to
// Σ|weight·y|.
const tolMoEHost = 1e-6

func testExperts(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(38, 3))
	worst := map[string]float64{}
	for _, dt := range allDTypes {
		for _, n := range []int{1, 3, 8, 40} {
			c := newMoECase(rng, dt, n)
			want, mag := c.want()
			for _, v := range mmVariants(b) {
				undo := v.set(b)
				what := fmt.Sprintf("Experts %s n=%d [%s]", dt, n, v.name)
				got := make([]float32, n*c.d+3)
				for i := range got {
					got[i] = 12345
				}
				calls := b.expertCalls
				b.Experts(got, c.x, n, c.experts, c.pick, c.weight, c.k)
				if b.expertCalls != calls+1 {
					t.Fatalf("%s: not run by Experts", what)
				}
				if got[n*c.d] != 12345 || got[n*c.d+2] != 12345 {
					t.Fatalf("%s: wrote past the output", what)
				}
				// The largest segment decides the path: 8 rows or fewer
				// are grouped gemv, more go to cuBLAS where it is.
				tol := mmTol(b, dt, (n+1)/2)
				ck := &checker{T: t, What: what, Tol: tol}
				for i := range want {
					ck.Check(i, got[i], float32(want[i]), mag[i], 1e-30)
				}
				k := fmt.Sprintf("%s tol %.0e", dt, tol)
				worst[k] = max(worst[k], ck.Worst)
				host, hmag := c.hostPath(b)
				hc := &checker{T: t, What: what + " vs MatMul", Tol: tolMoEHost}
				for i, h := range host {
					hc.Check(i, got[i], h, hmag[i], 1e-30)
				}
				worst["vs MatMul"] = max(worst["vs MatMul"], hc.Worst)
				undo()
			}
		}
	}
	for k, v := range worst {
		t.Logf("worst |err|/Σ|terms|  %-22s %.2g", k, v)
	}
}

func TestFakeExperts(t *testing.T) { testExperts(t, fakeBackend(t)) }

func TestGPUExperts(t *testing.T) { testExperts(t, gpuBackend(t)) }

// TestFakeExpertsCopiesNoWeights: once a layer's experts are on the
// device, an Experts call copies in its routing tables and x (not kept
// here) and nothing else, whatever path its segments take: the weights
// are read from the backend's cache, never copied per call. And the cache is what the
// kernels read: a weight changed on the host after its upload is not seen,
// so the comparison with the float64 layer of the changed weights fails,
// at the one output it touches of each row that chose that expert (the
// comparison of TestFakeExperts can fail).
func TestFakeExpertsCopiesNoWeights(t *testing.T) {
	b := fakeBackend(t)
	rng := rand.New(rand.NewPCG(38, 4))
	for _, dt := range allDTypes {
		for _, n := range []int{3, 40} {
			c := newMoECase(rng, dt, n)
			out := make([]float32, n*c.d)
			b.Experts(out, c.x, n, c.experts, c.pick, c.weight, c.k)
			before := b.h2dBytes
			b.Experts(out, c.x, n, c.experts, c.pick, c.weight, c.k)
			copied := b.h2dBytes - before
			if tables := 4*len(b.moe.route) + 8*len(b.moe.seg); copied != 4*len(c.x)+tables {
				t.Errorf("%s n=%d: a second call copied %d bytes, want x (%d) and the tables (%d)", dt, n, copied, 4*len(c.x), tables)
			}
		}
	}

	c := newMoECase(rng, kernels.F32, 8)
	out := make([]float32, c.n*c.d)
	b.Experts(out, c.x, c.n, c.experts, c.pick, c.weight, c.k)
	e := c.pick[0]
	down := c.experts[e].Down
	for f := range c.ff { // output 5 of expert e, changed on the host only
		row := down.Data[4*(5*c.ff+f):]
		row[0], row[1], row[2], row[3] = 0, 0, 0x80, 0x3f // 1.0
	}
	b.Experts(out, c.x, c.n, c.experts, c.pick, c.weight, c.k)
	want, mag := c.want()
	ft := &testing.T{}
	ck := &checker{T: ft, What: "stale weight", Tol: tolMatMul}
	for i := range want {
		ck.Check(i, out[i], float32(want[i]), mag[i], 1e-30)
	}
	chose := 0
	for _, p := range c.pick {
		if p == e {
			chose++
		}
	}
	if ck.Fails != chose {
		t.Fatalf("%d failures, want %d (output 5 of each row that chose expert %d)", ck.Fails, chose, e)
	}
}
