package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/mmap"
)

// benchBackends: the backend's own kernels with the SIMD path ("simd": AVX2,
// and AVX-512 where the CPU has it), with AVX2 only ("avx2", on CPUs with
// AVX-512) and with the scalar fallback ("scalar"), using all threads.
func benchBackends() []variant {
	initCPU()
	var v []variant
	if cpuHasSIMD {
		s := New(0)
		s.blasMinN = 0
		v = append(v, variant{"simd", s})
		if cpuHasAVX512 {
			a := New(0)
			a.blasMinN, a.avx512 = 0, false
			v = append(v, variant{"avx2", a})
			if cpuHasVNNI {
				f := New(0)
				f.blasMinN, f.vnni = 0, false
				v = append(v, variant{"avx512-float", f})
			}
		}
	}
	s := New(0)
	s.simd, s.blasMinN = false, 0
	return append(v, variant{"scalar", s})
}

var (
	peakOnce sync.Once
	peak     float64
	fmaOnce  sync.Once
	fma      float64
)

// fmaPeakOnce is Backend.fmaPeak of the default backend, best of three,
// measured once per benchmark run.
func fmaPeakOnce() float64 {
	fmaOnce.Do(func() {
		be := New(0)
		for range 3 {
			fma = max(fma, be.fmaPeak())
		}
	})
	return fma
}

// sgemmPeak is what OpenBLAS sgemm reaches on this machine, measured once
// per benchmark run (best of five) so that every MatMul figure is printed
// next to a ceiling taken under the same load: a 512-row product with a
// 2048x2048 f32 weight, split across all threads as the backend splits it.
func sgemmPeak() float64 {
	peakOnce.Do(func() {
		rng := rand.New(rand.NewPCG(9, 9))
		const n, rows, cols = 512, 2048, 2048
		w := randMatrix(rng, kernels.F32, rows, cols)
		x := randVec(rng, n*cols, 1)
		out := make([]float32, n*rows)
		be := New(0)
		be.blasMinN = 1
		be.MatMul(out, x, n, w)
		best := math.Inf(1)
		for range 5 {
			t0 := time.Now()
			be.MatMul(out, x, n, w)
			best = min(best, time.Since(t0).Seconds())
		}
		peak = 2 * n * rows * cols / best / 1e9
	})
	return peak
}

// matmulDTypes are the weight types BenchmarkMatMul covers.
var matmulDTypes = append([]kernels.DType{kernels.F32, kernels.F16, kernels.BF16, kernels.Q8_0}, kernels.QuantDTypes...)

// BenchmarkMatMul reports GFLOP/s (2·n·rows·cols per product), GB/s of
// weights streamed, the machine's sgemm GFLOP/s (sgemmPeak) and the ratio
// of the two ("of-sgemm"), and the FMA peak of the widest vectors the
// backend uses, on registers (fmaPeakOnce), with the ratio to it
// ("of-fma-peak": on a CPU with AVX-512, OpenBLAS's AVX2 sgemm is no
// ceiling). n = 1 is a decode step of one sequence, 8 and
// 32 a batched decode step, 512 a prefill chunk. "simd" and "scalar" are
// the own kernels; "blas" is the same product through OpenBLAS (for other
// dtypes than f32: on weight rows dequantised once, at n >= deqBLASMinN).
func BenchmarkMatMul(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	pk, fp := sgemmPeak(), fmaPeakOnce()
	for _, dt := range matmulDTypes {
		for _, sh := range [][2]int{{2048, 768}, {768, 2048}} {
			w := randMatrix(rng, dt, sh[0], sh[1])
			for _, n := range []int{1, 8, 32, 512} {
				x := randVec(rng, n*sh[1], 1)
				out := make([]float32, n*sh[0])
				var vs []variant
				for _, v := range benchBackends() {
					if v.name == "scalar" && n > 8 {
						continue // minutes at n=512, and no news
					}
					vs = append(vs, v)
				}
				if dt == kernels.F32 || n >= deqBLASMinN {
					bl := New(0)
					bl.blasMinN = 1
					vs = append(vs, variant{"blas", bl})
				}
				for _, v := range vs {
					b.Run(fmt.Sprintf("%s/%dx%d/n=%d/%s", dt, sh[0], sh[1], n, v.name), func(b *testing.B) {
						for b.Loop() {
							v.b.MatMul(out, x, n, w)
						}
						sec := b.Elapsed().Seconds()
						gf := float64(b.N) * 2 * float64(n*sh[0]*sh[1]) / sec / 1e9
						b.ReportMetric(gf, "GFLOP/s")
						b.ReportMetric(float64(b.N)*float64(len(w.Data))/sec/1e9, "GB/s")
						b.ReportMetric(pk, "sgemm-GFLOP/s")
						b.ReportMetric(gf/pk, "of-sgemm")
						b.ReportMetric(fp, "fma-peak-GFLOP/s")
						b.ReportMetric(gf/fp, "of-fma-peak")
					})
				}
			}
		}
	}
}

// BenchmarkMatMul1B: the products of a 512-token prefill of a 1.1B llama
// (TinyLlama's shapes: Q and O 2048x2048, K and V 256x2048, gate and up
// 5632x2048, down 2048x5632) with F16 weights, on all threads, as set
// next to llama.cpp's prompt processing on the same model.
func BenchmarkMatMul1B(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const n = 512
	be := New(0)
	be.blasMinN = 0
	for _, sh := range [][2]int{{2048, 2048}, {256, 2048}, {5632, 2048}, {2048, 5632}} {
		w := randMatrix(rng, kernels.F16, sh[0], sh[1])
		x := randVec(rng, n*sh[1], 1)
		out := make([]float32, n*sh[0])
		b.Run(fmt.Sprintf("f16/%dx%d/n=%d", sh[0], sh[1], n), func(b *testing.B) {
			for b.Loop() {
				be.MatMul(out, x, n, w)
			}
			b.ReportMetric(float64(b.N)*2*float64(n*sh[0]*sh[1])/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkMatMulDecode1B: the products of one decode row of a 1.1B llama
// (TinyLlama's shapes, and its 32000-row output) with F16 and Q8_0
// weights on all threads: GB/s of weights read. The 23 MB matrices may
// stay in a large L3 from one call to the next; the 131 MB output matrix
// streams from memory, as every matrix of a served model does.
func BenchmarkMatMulDecode1B(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, dt := range []kernels.DType{kernels.F16, kernels.Q8_0} {
		for _, sh := range [][2]int{{5632, 2048}, {2048, 5632}, {32000, 2048}} {
			w := randMatrix(rng, dt, sh[0], sh[1])
			x := randVec(rng, sh[1], 1)
			out := make([]float32, sh[0])
			for _, v := range benchBackends() {
				if v.name == "scalar" {
					continue
				}
				b.Run(fmt.Sprintf("%s/%dx%d/%s", dt, sh[0], sh[1], v.name), func(b *testing.B) {
					for b.Loop() {
						v.b.MatMul(out, x, 1, w)
					}
					b.ReportMetric(float64(b.N)*float64(len(w.Data))/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// BenchmarkAttention: decode is 16 sequences at 512 positions each (one
// query row each), 12 heads of 64 (MHA and GQA with 4 KV heads), page size
// 16, over an F32 pool and over an F16 one (--kv-cache-dtype f16, the
// server's usual decode case); prefill is one 512-token chunk. The pool of
// those holds the one layer read, which may stay in L3 from one call to
// the next; decode32x200-f16-12layers is a server's decode step instead:
// 32 sequences of 130-260 positions, all 12 layers of a pool far larger
// than L3, one call per layer. Reports GFLOP/s (4·hd per (row, head,
// position)) and GB/s of K/V read once.
func BenchmarkAttention(b *testing.B) {
	const heads, hd, ps = 12, 64, 16
	type bc struct {
		name       string
		kvh        int
		nseq, qlen int
		kvlen      int // of the first sequence; the last has kvlen+grow
		grow       int
		dt         kernels.DType
		layers     int // called in turn; 0: layer 1 of 2
	}
	for i, c := range []bc{
		{"decode16x512", 12, 16, 1, 512, 0, kernels.F32, 0},
		{"decode16x512-f16", 12, 16, 1, 512, 0, kernels.F16, 0},
		{"decode16x512-gqa4", 4, 16, 1, 512, 0, kernels.F32, 0},
		{"decode16x512-gqa4-f16", 4, 16, 1, 512, 0, kernels.F16, 0},
		{"decode32x200-f16-12layers", 12, 32, 1, 130, 130, kernels.F16, 12},
		{"prefill512", 12, 1, 512, 512, 0, kernels.F32, 0},
	} {
		shapes := make([][2]int, c.nseq)
		var flops, bytes float64
		for j := range shapes {
			kvlen := c.kvlen
			if c.nseq > 1 {
				kvlen += c.grow * j / (c.nseq - 1)
			}
			shapes[j] = [2]int{c.qlen, kvlen}
			for r := 0; r < c.qlen; r++ {
				flops += heads * float64(kvlen-c.qlen+r+1) * 4 * hd
			}
			bytes += float64(kvlen) * float64(c.kvh*hd) * float64(c.dt.RowBytes(1)) * 2
		}
		layers := []int{1}
		if c.layers > 0 {
			layers = layers[:0]
			for l := range c.layers {
				layers = append(layers, l)
			}
		}
		flops *= float64(len(layers))
		bytes *= float64(len(layers))
		// Built on first use: the 12-layer pool takes a while.
		setup := sync.OnceValue(func() kernelstest.AttnCase {
			rng := rand.New(rand.NewPCG(2, uint64(i)))
			ac := kernelstest.NewAttnCase(rng, heads, c.kvh, hd, ps, shapes)
			if c.dt != kernels.F32 {
				ac.KV = kernelstest.NarrowKV(ac.KV, c.dt)
			}
			if c.layers > 0 {
				// Each page's two layers repeated, in huge pages as a
				// server's pool is (kvpool's prefault): in 4 KiB pages
				// the scattered rows cost a TLB miss each.
				pf := ac.KV.PageFloats()
				// Kept to the end of the run: every variant reads it.
				buf, _, err := mmap.Anon(len(ac.KV.Data) / 2 * c.layers * 4)
				if err != nil {
					b.Fatal(err)
				}
				data := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)/4)[:0]
				for p := 0; p < len(ac.KV.Data); p += pf {
					for range c.layers / 2 {
						data = append(data, ac.KV.Data[p:p+pf]...)
					}
				}
				ac.KV.Layers, ac.KV.Data = c.layers, data
			}
			return ac
		})
		scale := float32(1 / math.Sqrt(hd))
		for _, v := range benchBackends() {
			b.Run(c.name+"/"+v.name, func(b *testing.B) {
				ac := setup()
				out := make([]float32, len(ac.Q))
				for b.Loop() {
					for _, l := range layers {
						v.b.Attention(out, ac.Q, ac.KV, l, ac.Seqs, heads, scale)
					}
				}
				sec := b.Elapsed().Seconds()
				b.ReportMetric(float64(b.N)*flops/sec/1e9, "GFLOP/s")
				b.ReportMetric(float64(b.N)*bytes/sec/1e9, "GB/s")
			})
		}
	}
}

// BenchmarkMatMulStep: the products of one decode step of n rows of the
// 134M llama (12 layers of Q, K, V, O 768x768, gate and up 2048x768, down
// 768x2048, and the 32000x768 output), f32 weights: 536 MB, far more than
// L3, so every product streams its weights from memory as a served step
// does (BenchmarkMatMul's matrices stay in cache). GFLOP/s of the step,
// for the own kernels and OpenBLAS ("blas", from 32 rows). On the AVX2
// kind's stand-in at 32 rows the own gemm ran 130 GFLOP/s (median of six
// rounds) before it prefetched the next tile's rows (pf_tile in cpu.c) and
// 152 after, OpenBLAS 110, against 176 for the own gemm on weights in
// cache: what the step loses is the stream from memory.
func BenchmarkMatMulStep(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	var ws []*kernels.Matrix
	for range 12 {
		for _, sh := range [][2]int{{768, 768}, {768, 768}, {768, 768}, {768, 768}, {2048, 768}, {2048, 768}, {768, 2048}} {
			ws = append(ws, randMatrix(rng, kernels.F32, sh[0], sh[1]))
		}
	}
	ws = append(ws, randMatrix(rng, kernels.F32, 32000, 768))
	flops, total := 0, 0
	for _, w := range ws {
		flops += 2 * w.Rows * w.Cols
		total += len(w.Data)
	}
	// One mapping in huge pages, as the server's copy of the weights
	// (model.copyToHost); kept to the end of the run.
	buf, _, err := mmap.Anon(total)
	if err != nil {
		b.Fatal(err)
	}
	at := 0
	for _, w := range ws {
		n := copy(buf[at:], w.Data)
		w.Data = buf[at : at+n : at+n]
		at += n
	}
	for _, n := range []int{8, 32, 512} {
		x := randVec(rng, n*2048, 1)
		out := make([]float32, n*32000)
		bl := New(0)
		bl.blasMinN = 1
		for _, v := range append(benchBackends(), variant{"blas", bl}) {
			if v.name == "scalar" || v.name == "blas" && n < 32 {
				continue
			}
			b.Run(fmt.Sprintf("f32/n=%d/%s", n, v.name), func(b *testing.B) {
				for b.Loop() {
					for _, w := range ws {
						v.b.MatMul(out[:n*w.Rows], x[:n*w.Cols], n, w)
					}
				}
				b.ReportMetric(float64(b.N)*float64(n*flops)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/step")
			})
		}
	}
}
