package cuda

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
)

// Device-side benchmarks (CUDA events around the kernels only, no host
// copies): paged decode attention in GB/s of K/V read, against the
// device's own copy bandwidth (cuMemcpyDtoD, counted as bytes read +
// bytes written), and the gemv kernels in GB/s of weights read.

// copyGBs measures cuMemcpyDtoD of bytes, iters times: (read+write)/s.
func copyGBs(be *Backend, bytes, iters int) float64 {
	be.lock()
	defer be.unlock()
	src := be.alloc(bytes, "copy benchmark")
	dst := be.alloc(bytes, "copy benchmark")
	defer be.free(src)
	defer be.free(dst)
	be.copyDtoD(dst, src, bytes) // warm
	sec := be.timed(func() {
		for i := 0; i < iters; i++ {
			be.copyDtoD(dst, src, bytes)
		}
	})
	return 2 * float64(bytes) * float64(iters) / sec / 1e9
}

// filledPool is kv with a pool of pages pages on be, every element 1e-3
// (the benchmarks' KV; the caller closes it).
func filledPool(be *Backend, kv kernels.PagedKV, pages int) kernels.PagedKV {
	dk, err := be.AllocKV(kv, pages)
	if err != nil {
		panic(err)
	}
	if err := dk.Fill(nil, 1e-3); err != nil {
		panic(err)
	}
	kv.Device = dk
	return kv
}

// attnDecodeGBs runs decode attention (QLen 1) for seqs sequences of kvlen
// positions over a pool of dtype dt, iters times, and returns GB/s of K and
// V read.
func attnDecodeGBs(be *Backend, dt kernels.DType, seqs, kvlen, heads, kvHeads, hd, ps, iters int) (float64, int) {
	kv := kernels.PagedKV{PageSize: ps, Layers: 1, KVHeads: kvHeads, HeadDim: hd, DType: dt}
	per := (kvlen + ps - 1) / ps
	kv = filledPool(be, kv, seqs*per)
	defer kv.Device.Close()
	ss := make([]kernels.AttnSeq, seqs)
	for s := range ss {
		pages := make([]int32, per)
		for j := range pages {
			pages[j] = int32((j*seqs + s) % (seqs * per)) // sequences interleaved in the pool
		}
		ss[s] = kernels.AttnSeq{Pages: pages, QStart: s, QLen: 1, KVLen: kvlen}
	}
	q := make([]float32, seqs*heads*hd)
	for i := range q {
		q[i] = float32(i%13) * 0.01
	}
	var pl attnPlan
	pl.plan(kv, 0, ss, heads, len(q), len(q), false)
	be.lock()
	defer be.unlock()
	a := be.attnUpload(kv, &pl, heads, 0.1)
	dq := upload(be, sX, q)
	do := be.buf(sOut, 4*len(q))
	be.attnLaunch(a, dq, do) // warm
	sec := be.timed(func() {
		for i := 0; i < iters; i++ {
			be.attnLaunch(a, dq, do)
		}
	})
	bytes := float64(seqs) * float64(kvlen) * float64(kv.RowFloats()) * float64(kv.ElemBytes()) * 2
	return bytes * float64(iters) / sec / 1e9, a.nsplit
}

// gemvGBs runs an n-row product against a rows x cols weight of dtype dt.
func gemvGBs(be *Backend, dt kernels.DType, rows, cols, n, iters int) float64 {
	w := &kernels.Matrix{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, dt.RowBytes(cols)*rows)}
	for i := range w.Data {
		w.Data[i] = byte(i * 7 % 61) // small f16/bf16 values, block scales
	}
	be.lock()
	defer be.unlock()
	m := be.weight(w)
	x := upload(be, sX, make([]float32, n*cols))
	out := be.buf(sOut, 4*n*rows)
	be.matmul(out, x, n, m)
	sec := be.timed(func() {
		for i := 0; i < iters; i++ {
			be.matmul(out, x, n, m)
		}
	})
	return float64(len(w.Data)) * float64(iters) / sec / 1e9
}

// expertLayer is a layer of experts of dim d and ffn ff, on the device.
func expertLayer(be *Backend, dt kernels.DType, experts, d, ff int) []kernels.Expert {
	ex := make([]kernels.Expert, experts)
	mat := func(rows, cols int) *kernels.Matrix {
		w := &kernels.Matrix{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, dt.RowBytes(cols)*rows)}
		for i := range w.Data {
			w.Data[i] = byte(i * 7 % 61)
		}
		return w
	}
	var ms []*kernels.Matrix
	for e := range ex {
		ex[e] = kernels.Expert{Gate: mat(ff, d), Up: mat(ff, d), Down: mat(d, ff)}
		ms = append(ms, ex[e].Gate, ex[e].Up, ex[e].Down)
	}
	if err := be.Preload(ms...); err != nil {
		panic(err)
	}
	return ex
}

// expertsGBs runs the layer ex over n rows (k experts a row, rows choosing
// experts round the table) iters times with x and out kept on the device,
// through Experts or, with host set, as the model runs it on a backend
// without Experts (rows gathered on the host, MatMul per expert and
// product, the weighted sum on the host). It returns GB/s of the chosen
// experts' weights (each read once a call), wall clock, copies included.
func expertsGBs(be *Backend, ex []kernels.Expert, k, n, iters int, host bool) float64 {
	experts, d, ff := len(ex), ex[0].Gate.Cols, ex[0].Gate.Rows
	pick, weight := make([]int32, n*k), make([]float32, n*k)
	chosen := map[int32]bool{}
	for i := range pick {
		pick[i] = int32((i/k*3 + i%k*5) % experts)
		weight[i] = 1 / float32(k)
		chosen[pick[i]] = true
	}
	x, out := make([]float32, n*d), make([]float32, n*d)
	in, g, u, y := make([]float32, n*d), make([]float32, n*ff), make([]float32, n*ff), make([]float32, n*d)
	be.Keep(x, out, g, u) // as the model keeps s.h, s.o, s.gate and s.up, not its host buffers
	run := func() {
		if !host {
			be.Experts(out, x, n, ex, pick, weight, k)
			return
		}
		be.Host(x) // the model's host path: rows to the host, one product per expert
		clear(out)
		for e := range ex {
			var rows []int
			for p, pe := range pick {
				if int(pe) == e {
					rows = append(rows, p)
				}
			}
			if len(rows) == 0 {
				continue
			}
			for j, p := range rows {
				copy(in[j*d:(j+1)*d], x[p/k*d:(p/k+1)*d])
			}
			r := len(rows)
			be.MatMul(g[:r*ff], in[:r*d], r, ex[e].Gate)
			be.MatMul(u[:r*ff], in[:r*d], r, ex[e].Up)
			be.SwiGLU(g[:r*ff], g[:r*ff], u[:r*ff])
			be.MatMul(y[:r*d], g[:r*ff], r, ex[e].Down)
			for j, p := range rows {
				dst := out[p/k*d : (p/k+1)*d]
				for c, v := range y[j*d : (j+1)*d] {
					dst[c] += weight[p] * v
				}
			}
		}
		be.Changed(out)
	}
	run()
	be.Host(out)
	start := time.Now()
	for range iters {
		run()
	}
	be.Host(out)
	be.Changed(out)
	sec := time.Since(start).Seconds()
	return float64(len(chosen)) * float64(len(ex[0].Gate.Data)+len(ex[0].Up.Data)+len(ex[0].Down.Data)) * float64(iters) / sec / 1e9
}

// BenchmarkGPUExperts: a layer of moe-2.5b's shape (64 experts of dim 1024
// and ffn 512, 8 a row) through Experts and through the host path it
// replaces.
func BenchmarkGPUExperts(b *testing.B) {
	be := gpuBackend(b)
	for _, dt := range []kernels.DType{kernels.F16, kernels.Q8_0} {
		ex := expertLayer(be, dt, 64, 1024, 512)
		for _, n := range []int{1, 32, 512} {
			for _, path := range []string{"experts", "host"} {
				b.Run(fmt.Sprintf("%s/n%d/%s", dt, n, path), func(b *testing.B) {
					b.ReportMetric(expertsGBs(be, ex, 8, n, b.N, path == "host"), "weights_GB/s")
				})
			}
		}
	}
}

func BenchmarkGPUAttentionDecode(b *testing.B) {
	be := gpuBackend(b)
	cp := copyGBs(be, 1<<30, 20)
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F8E4M3, kernels.F32} {
		for _, c := range []struct{ seqs, kvlen int }{{64, 4096}, {1, 32768}, {1, 512}, {256, 1024}} {
			b.Run(fmt.Sprintf("%s/seqs%d/ctx%d/heads32-8/hd128", dt, c.seqs, c.kvlen), func(b *testing.B) {
				gbs, splits := attnDecodeGBs(be, dt, c.seqs, c.kvlen, 32, 8, 128, 16, b.N)
				b.ReportMetric(gbs, "attn_GB/s")
				b.ReportMetric(cp, "copy_GB/s")
				b.ReportMetric(gbs/cp*2, "attn/copy_read")
				b.ReportMetric(float64(splits), "splits")
			})
		}
	}
}

// gemmTFLOPs runs a bf16 cuBLAS GemmEx product of n x n by n x n
// (float32 accumulation, as the backend's prompt products), iters times,
// and returns TFLOP/s at 2n³ a product: the tensor cores' peak the
// prefill figures are set against. The inputs are small nonzero values
// (zeros would draw less power than real data).
func gemmTFLOPs(be *Backend, n, iters int) float64 {
	be.lock()
	defer be.unlock()
	host := make([]uint16, n*n)
	for i := range host {
		host[i] = kernels.F32ToBF16(float32(i%17-8) / 64)
	}
	a, x := be.alloc(2*n*n, "gemm benchmark"), be.alloc(2*n*n, "gemm benchmark")
	c := be.alloc(4*n*n, "gemm benchmark")
	defer be.free(a)
	defer be.free(x)
	defer be.free(c)
	be.h2d(a, unsafe.Pointer(&host[0]), 2*n*n)
	be.h2d(x, unsafe.Pointer(&host[0]), 2*n*n)
	be.gemmEx(c, n, n, n, a, x, 14 /* CUDA_R_16BF */, n) // warm
	sec := be.timed(func() {
		for i := 0; i < iters; i++ {
			be.gemmEx(c, n, n, n, a, x, 14, n)
		}
	})
	return 2 * float64(n) * float64(n) * float64(n) * float64(iters) / sec / 1e12
}

// causalAttnFLOPs is the arithmetic of causal attention over one prompt
// of plen tokens from position 0 at heads query heads of head dim hd:
// Q·Kᵀ and P·V, 2·hd multiply-adds each for every (row, position) pair
// a row sees, plen(plen+1)/2 of them. The masked half a tile computes
// anyway is not counted.
func causalAttnFLOPs(plen, heads, hd int) float64 {
	return 4 * float64(hd) * float64(heads) * float64(plen) * float64(plen+1) / 2
}

// attnPrefillTFLOPs runs prompt attention (one sequence of plen tokens
// from position 0, the tensor-core kernel) over a pool of dtype dt, iters
// times, and returns TFLOP/s (causalAttnFLOPs) and how many times the
// tensor-core kernel ran.
func attnPrefillTFLOPs(be *Backend, dt kernels.DType, plen, heads, kvHeads, hd, ps, iters int) (float64, int) {
	kv := kernels.PagedKV{PageSize: ps, Layers: 1, KVHeads: kvHeads, HeadDim: hd, DType: dt}
	per := (plen + ps - 1) / ps
	kv = filledPool(be, kv, per)
	defer kv.Device.Close()
	pages := make([]int32, per)
	for j := range pages {
		pages[j] = int32(j)
	}
	ss := []kernels.AttnSeq{{Pages: pages, QStart: 0, QLen: plen, KVLen: plen}}
	q := make([]float32, plen*heads*hd)
	for i := range q {
		q[i] = float32(i%13) * 0.01
	}
	var pl attnPlan
	pl.plan(kv, 0, ss, heads, len(q), len(q), true)
	be.lock()
	defer be.unlock()
	before := be.launches
	a := be.attnUpload(kv, &pl, heads, 0.1)
	dq := upload(be, sX, q)
	do := be.buf(sOut, 4*len(q))
	be.attnLaunch(a, dq, do) // warm
	sec := be.timed(func() {
		for i := 0; i < iters; i++ {
			be.attnLaunch(a, dq, do)
		}
	})
	mma := 0
	for k := kAttnMMAF16HD64; k <= kAttnMMABF16HD256; k++ {
		mma += be.launches[k] - before[k]
	}
	return causalAttnFLOPs(plen, heads, hd) * float64(iters) / sec / 1e12, mma
}

// BenchmarkGPUAttentionPrefill: prompt attention on the tensor cores, one
// 4096-token prompt over a bf16 pool (GQA 32/8; hd 64 is the dummy 1B's),
// in TFLOP/s next to the bf16 GemmEx peak measured here (issue 35's goal:
// at least half of it).
func BenchmarkGPUAttentionPrefill(b *testing.B) {
	be := gpuBackend(b)
	peak := gemmTFLOPs(be, 8192, 10)
	for _, hd := range []int{64, 128, 256} {
		b.Run(fmt.Sprintf("bf16/prompt4096/heads32-8/hd%d", hd), func(b *testing.B) {
			tf, _ := attnPrefillTFLOPs(be, kernels.BF16, 4096, 32, 8, hd, 16, b.N)
			b.ReportMetric(tf, "attn_TFLOP/s")
			b.ReportMetric(peak, "peak_TFLOP/s")
			b.ReportMetric(tf/peak, "attn/peak")
		})
	}
}

// benchDTypes are every weight dtype the backend multiplies.
var benchDTypes = append(append([]kernels.DType(nil), allDTypes...), kernels.QuantDTypes...)

func BenchmarkGPUMatMul(b *testing.B) {
	be := gpuBackend(b)
	b.Run("peak/bf16-gemmex/8192x8192x8192", func(b *testing.B) {
		b.ReportMetric(gemmTFLOPs(be, 8192, b.N), "TFLOP/s")
	})
	for _, dt := range benchDTypes {
		for _, n := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/4096x4096/n%d", dt, n), func(b *testing.B) {
				b.ReportMetric(gemvGBs(be, dt, 4096, 4096, n, b.N), "weights_GB/s")
			})
		}
	}
}

// TestFakeBenchHelpers runs the benchmark helpers at toy sizes, so they
// are known to work before a GPU machine runs them.
func TestFakeBenchHelpers(t *testing.T) {
	be := fakeBackend(t)
	if g := copyGBs(be, 1<<16, 2); g <= 0 {
		t.Fatalf("copy %g GB/s", g)
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F8E4M3} {
		if g, s := attnDecodeGBs(be, dt, 2, 300, 8, 2, 16, 16, 2); g <= 0 || s < 1 {
			t.Fatalf("%s attention %g GB/s, %d splits", dt, g, s)
		}
	}
	for _, dt := range benchDTypes {
		for _, n := range []int{1, 12} {
			if g := gemvGBs(be, dt, 8, max(64, dt.BlockSize()), n, 1); g <= 0 {
				t.Fatalf("%s n=%d: %g GB/s", dt, n, g)
			}
		}
	}
	if tf := gemmTFLOPs(be, 64, 1); tf <= 0 {
		t.Fatalf("gemm %g TFLOP/s", tf)
	}
	if tf, mma := attnPrefillTFLOPs(be, kernels.BF16, 40, 4, 2, 64, 16, 2); tf <= 0 || mma != 3 {
		t.Fatalf("prompt attention %g TFLOP/s, the tensor-core kernel ran %d times, want 3", tf, mma)
	}
	if got, want := causalAttnFLOPs(3, 2, 4), 4.0*4*2*6; got != want {
		t.Fatalf("causalAttnFLOPs(3, 2, 4) = %g, want %g", got, want)
	}
	ex := expertLayer(be, kernels.Q8_0, 8, 64, 32)
	for _, host := range []bool{false, true} {
		if g := expertsGBs(be, ex, 2, 12, 1, host); g <= 0 {
			t.Fatalf("experts (host path %v): %g GB/s", host, g)
		}
	}
}
