// Package cpu is the fast CPU implementation of kernels.Backend: C kernels
// (cpu.c) with an AVX2+FMA+F16C path chosen at run time and a portable
// scalar fallback, OpenBLAS sgemm for float32 products of many rows, and
// each operation split into contiguous ranges run on a small pool of
// goroutines (pool.go), one cgo call per range. Semantics are those of
// kernels/ref; results agree with it to float32 rounding (the tests state
// the tolerances).
//
// Building needs cgo and OpenBLAS (Debian: apt-get install libopenblas-dev).
// Building with CGO_CFLAGS=-DBK_NO_SIMD leaves out the x86 SIMD code.
package cpu

/*
#cgo CFLAGS: -O3 -std=gnu11
#cgo linux,amd64 CFLAGS: -I/usr/include/x86_64-linux-gnu/openblas-pthread -I/usr/include/x86_64-linux-gnu/openblas-openmp -I/usr/include/x86_64-linux-gnu/openblas-serial
#cgo linux,arm64 CFLAGS: -I/usr/include/aarch64-linux-gnu/openblas-pthread -I/usr/include/aarch64-linux-gnu/openblas-openmp -I/usr/include/aarch64-linux-gnu/openblas-serial
#cgo LDFLAGS: -lopenblas -lm
#include "cpu.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
)

// Tuning constants, picked with the benchmarks in bench_test.go on a
// 2-vCPU Zen 4 VM.
const (
	// defaultBLASMinN: float32 products with at least this many x rows go
	// to OpenBLAS sgemm (on CPUs without AVX-512; see New). Below it the own AVX2 kernel is faster (per core,
	// 768..4096 columns: 1.5-3x at n=4..16, ~1.3x at n=32, even at n=64,
	// while sgemm is ~1.3x faster at n=256).
	defaultBLASMinN = 64
	// deqBLASMinN: on a CPU without AVX2 (the scalar kernels), products of
	// non-f32 weights with at least this many x rows (a prefill chunk)
	// dequantise each weight row once and use sgemm. With AVX2 the own gemm
	// is faster at every n since it dequantises a megabyte of rows once for
	// every block of x (GD_BYTES): 512 rows, 2 threads, medians of three
	// interleaved rounds, own against dequantise-then-sgemm, F16 2048x2048
	// 144 against 116 GFLOP/s, 5632x2048 156 against 137-148, 2048x5632 148
	// against 122-130; Q4_K 174 against 116-145, 163 against 145-148, 138
	// against 128-130.
	deqBLASMinN = 128
	// defaultMinWork is the least work worth giving to one more thread, in
	// multiply-add equivalents (~1.3 µs of AVX2 work; a hot dispatch costs
	// ~0.5 µs). Measured costs per element: SwiGLU ~12, Add ~3, RMSNorm ~4,
	// a RoPE sin+cos ~500.
	defaultMinWork = 1 << 15
	// Matrix rows are split in multiples of this (the gemm's micro-tile).
	rowAlign = 6
	// rowAlign512 is rowAlign for the AVX-512 gemm: two of its 8-row
	// micro-tiles, which it writes out together; a range of another size
	// ends in a part tile whose missing rows are computed and dropped.
	rowAlign512 = 16
)

var (
	initOnce     sync.Once
	cpuHasSIMD   bool
	cpuHasAVX512 bool
	cpuHasVNNI   bool
	blasMu       sync.Mutex
	blasThread   = -1 // OpenBLAS thread count last set
)

// Backend is the CPU backend. It is safe for concurrent use.
type Backend struct {
	threads  int
	simd     bool // use the AVX2 kernels (only when the CPU has them)
	avx512   bool // with simd: use the AVX-512 kernels where there are some
	vnni     bool // with avx512: the int8 gemm of the block formats (qgemm)
	blasMinN int  // f32 MatMul with n >= blasMinN uses OpenBLAS; 0: never
	minWork  int  // least work per thread (tests set 1 to force splitting)
	// The AVX-512 gemm splits x between threads from splitXPanels panels
	// per thread and splitXWeights weight elements on (tests set 1, 1),
	// splitXRows weight rows per C call (tests set 16).
	splitXPanels, splitXWeights, splitXRows int
	pool                                    *pool
}

var _ kernels.Backend = (*Backend)(nil)

// New returns a backend using threads threads (<= 0: runtime.NumCPU()).
// OpenBLAS (process-wide) is set to one thread: the backend splits each
// sgemm by weight rows across its own pool like every other operation, so
// OpenBLAS's spinning workers never compete with the pool's for the cores.
func New(threads int) *Backend {
	initCPU()
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	setBLASThreads(1)
	b := &Backend{threads: threads, simd: cpuHasSIMD, avx512: cpuHasAVX512 && os.Getenv("BATON_CPU_AVX512") != "0",
		vnni:     cpuHasVNNI && os.Getenv("BATON_CPU_VNNI") != "0",
		blasMinN: defaultBLASMinN, minWork: defaultMinWork, pool: poolFor(threads),
		splitXPanels: gemmSplitXPanels, splitXWeights: gemmSplitXWeights, splitXRows: gemmSplitXRows}
	if b.simd && b.avx512 {
		// Debian's OpenBLAS runs its AVX2 (Haswell) kernels on these CPUs;
		// the own AVX-512 gemm is 1.2-2x faster at every n measured
		// (768..5632 rows and columns, n 32 and 512).
		b.blasMinN = 0
	}
	return b
}

// initCPU builds the C tables and detects the CPU's features.
func initCPU() {
	initOnce.Do(func() {
		cpuHasSIMD = C.bk_init() != 0
		cpuHasAVX512 = C.bk_have_avx512() != 0
		cpuHasVNNI = C.bk_have_vnni() != 0
	})
}

func setBLASThreads(n int) {
	blasMu.Lock()
	defer blasMu.Unlock()
	if blasThread != n {
		C.bk_blas_set_threads(C.int(n))
		blasThread = n
	}
}

// Name implements kernels.Backend.
func (*Backend) Name() string { return "cpu" }

// Threads is the number of threads each operation may use.
func (b *Backend) Threads() int { return b.threads }

// Features describes what was chosen at run time, e.g.
// "avx2+fma+f16c, openblas 0.3.21 (Zen) for f32 n>=64, 2 threads".
func (b *Backend) Features() string {
	isa := "scalar"
	if b.simd && cpuHasSIMD {
		isa = "avx2+fma+f16c"
		if b.avx512 {
			isa += ", avx512 (gemm for n>=8, decode rows, K-format dot products, attention)"
			if b.vnni {
				isa += ", avx512-vnni (int8 gemm of the block formats for n>=16, n>=8 for the 32-element ones)"
			}
		} else if cpuHasAVX512 {
			isa += " (avx512 available, disabled)"
		}
	} else if cpuHasSIMD {
		isa = "scalar (avx2 available, disabled)"
	}
	blas := "no blas"
	if b.blasMinN > 0 {
		cfg := strings.Fields(C.GoString(C.bk_blas_config()))
		ver := "openblas"
		if len(cfg) >= 2 && strings.EqualFold(cfg[0], "openblas") {
			ver = "openblas " + cfg[1]
		}
		blas = fmt.Sprintf("%s (%s) for f32 n>=%d", ver, C.GoString(C.bk_blas_corename()), b.blasMinN)
		if !(b.simd && cpuHasSIMD) {
			blas += fmt.Sprintf(", dequantised n>=%d", max(b.blasMinN, deqBLASMinN))
		}
	}
	return fmt.Sprintf("%s, %s, %d threads", isa, blas, b.threads)
}

// simdFlag is the kernels' simd argument: 0 scalar, 1 AVX2, 2 AVX-512
// allowed (each only where the CPU has it).
func (b *Backend) simdFlag() C.int {
	switch {
	case b.simd && b.avx512:
		return 2
	case b.simd:
		return 1
	}
	return 0
}

// fmaPeak measures the GFLOP/s of the backend's widest FMA on registers
// (no memory), on all its threads at once: the ceiling the benchmarks set
// their products against. 0 on the scalar path.
func (b *Backend) fmaPeak() float64 {
	const iters = 20_000_000
	var sink C.double
	if C.bk_fma_peak(b.simdFlag(), 1000, &sink) == 0 {
		return 0
	}
	var wg sync.WaitGroup
	flops := make([]float64, b.threads)
	t0 := time.Now()
	for i := range b.threads {
		wg.Go(func() {
			var s C.double
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			flops[i] = float64(C.bk_fma_peak(b.simdFlag(), iters, &s)) * iters
		})
	}
	wg.Wait()
	sec := time.Since(t0).Seconds()
	var total float64
	for _, f := range flops {
		total += f
	}
	return total / sec / 1e9
}

// rangesPerThread: operations are cut into this many ranges per thread
// (when big enough), handed out dynamically, to absorb threads that start
// late or run slower.
const rangesPerThread = 4

// parallel splits [0, total) into contiguous ranges, each a multiple of
// align long (except the last) and worth at least b.minWork (work is the
// whole operation's, in multiply-add equivalents, see defaultMinWork), and
// runs fn on them on the backend's pool.
func (b *Backend) parallel(total, align int, work int, fn func(lo, hi int)) {
	if total <= 0 {
		return
	}
	units := (total + align - 1) / align
	parts := min(b.threads*rangesPerThread, work/b.minWork, units)
	if parts <= 1 || b.threads <= 1 {
		fn(0, total)
		return
	}
	b.pool.run(cut(total, align, parts), b.threads, fn)
}

// Parallel implements kernels.Paralleler: n items of host work (a decode
// step's sampling) on the pool's threads, a few ranges per thread.
func (b *Backend) Parallel(n int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	parts := min(n, b.threads*rangesPerThread)
	if parts <= 1 || b.threads <= 1 {
		fn(0, n)
		return
	}
	b.pool.run(cut(n, 1, parts), b.threads, fn)
}

// cut splits [0, total) into parts ranges of about equal size whose
// bounds are multiples of align (the last ends at total).
func cut(total, align, parts int) []int {
	units := (total + align - 1) / align
	bounds := make([]int, parts+1)
	for p := 1; p <= parts; p++ {
		bounds[p] = min(units*p/parts*align, total)
	}
	return bounds
}

func fptr(s []float32) *C.float { return (*C.float)(unsafe.Pointer(unsafe.SliceData(s))) }

// MatMul implements kernels.Backend.
func (b *Backend) MatMul(out, x []float32, n int, w *kernels.Matrix) {
	if n <= 0 {
		return
	}
	kernels.CheckMatMul(out, x, n, w)
	wp := unsafe.Pointer(unsafe.SliceData(w.Data))
	work := n * w.Rows * w.Cols
	switch b.matmulPath(w.DType, n, w.Cols, uintptr(wp)%4 == 0) {
	case pathSgemm:
		b.parallel(w.Rows, rowAlign, work, func(lo, hi int) {
			C.bk_sgemm(fptr(out), fptr(x), C.int64_t(n), (*C.float)(wp),
				C.int64_t(w.Rows), C.int64_t(w.Cols), C.int64_t(lo), C.int64_t(hi))
		})
	case pathDeqSgemm:
		b.parallel(w.Rows, rowAlign, work, func(lo, hi int) {
			C.bk_deq_sgemm(b.simdFlag(), fptr(out), fptr(x), C.int64_t(n), (*C.uint8_t)(wp), C.int(w.DType),
				C.int64_t(w.Rows), C.int64_t(w.Cols), C.int64_t(lo), C.int64_t(hi))
		})
	case pathQGemm:
		b.qgemm(out, x, n, w, wp, work)
	case pathQdot:
		b.qdot(out, x, n, w, wp, work)
	case pathGemm:
		b.gemm(out, x, n, w, wp, work)
	default:
		b.parallel(w.Rows, rowAlign, work, func(lo, hi int) {
			C.bk_matmul(b.simdFlag(), fptr(out), fptr(x), C.int64_t(n), (*C.uint8_t)(wp),
				C.int(w.DType), C.int64_t(w.Rows), C.int64_t(w.Cols), C.int64_t(lo), C.int64_t(hi))
		})
	}
}

// The kernels a MatMul can take, in the order matmulPath tries them.
const (
	pathSgemm    = iota // OpenBLAS on f32 weights
	pathDeqSgemm        // OpenBLAS on weight rows dequantised once
	pathQGemm           // the int8 gemm (x quantised)
	pathQdot            // integer dot products (x quantised)
	pathGemm            // the own gemm on packed x
	pathRows            // dot products a weight row at a time
)

// matmulPath picks MatMul's kernel for n rows of x with dt weights of
// cols columns (aligned: the weight data is 4-byte aligned, as sgemm
// needs).
func (b *Backend) matmulPath(dt kernels.DType, n, cols int, aligned bool) int {
	switch {
	case dt == kernels.F32 && b.blasMinN > 0 && n >= b.blasMinN && aligned:
		return pathSgemm
	case dt != kernels.F32 && b.blasMinN > 0 && !(b.simd && cpuHasSIMD) && n >= max(b.blasMinN, deqBLASMinN):
		return pathDeqSgemm
	case b.useQGemm(dt, n, cols):
		return pathQGemm
	case useQdot(dt, n):
		return pathQdot
	case b.simd && cpuHasSIMD && (n >= gemmMinN || n >= gemmMinN512 && b.avx512):
		return pathGemm
	}
	return pathRows
}

// useQdot: products of n x rows with weights in one of the ggml block
// formats quantise x to 8 bits (one scale per block of the format: 32
// elements, 256 for the K formats) and use integer dot products (what a
// decode step of a few sequences is: bound by reading the weights, which
// stay 4-6 bits a value all the way into the registers). From 4 rows on,
// gemm's dequantised tiles and float FMAs win for the 32-element formats;
// the K formats' kernels (one set of scales per 256 elements, unpacked
// with vector shuffles) keep up with the gemm to 32 rows (per core,
// 2048x768: Q4_K 71 GOP/s from 4 to 32 rows against the gemm's 25-69,
// Q6_K 61-66 against 22-62). Q8_0 at one row stays on the float decode
// rows, which stream it faster (5632x2048: 37 against 25 GB/s); at 2 and
// 3 rows the integer path is 3x the float dot products. Where the CPU
// has AVX512-VNNI, MatMul asks useQGemm first.
func useQdot(dt kernels.DType, n int) bool {
	switch {
	case dt == kernels.Q4_K || dt == kernels.Q5_K || dt == kernels.Q6_K:
		return n < 32
	case dt == kernels.Q8_0:
		return n >= 2 && n < 4
	case dt >= kernels.Q4_0:
		return n < 4
	}
	return false
}

// useQGemm: products of several x rows with weights in a ggml block
// format quantise x to 8 bits, as qdot does, and multiply with
// AVX512-VNNI (bk_qgemm): a vpdpbusd does 64 multiply-adds where the float
// gemm's FMA does 16, and each weight row is unpacked once for all rows.
// It takes the K formats from 16 rows, where it passes qdot (weights from
// memory, 2 threads, Q4_K 5632x2048 and 2048x5632: 16 rows 1.2-1.9x, 8
// rows 0.75-1.5x), and the 32-element formats from 8, where it passes
// the float gemm (Q8_0, 8 rows 1.8-2.7x, 16 rows 1.2-1.9x).
func (b *Backend) useQGemm(dt kernels.DType, n, cols int) bool {
	least := 8
	if dt.BlockSize() == 256 {
		least = 16
	}
	return b.simd && b.avx512 && b.vnni && cpuHasVNNI && n >= least &&
		C.bk_qgemm_takes(C.int(dt), C.int64_t(cols)) != 0
}

// quantisesX says whether MatMul of n rows with dt weights quantises x to
// 8 bits (what its error is bounded by).
func (b *Backend) quantisesX(dt kernels.DType, n, cols int) bool {
	p := b.matmulPath(dt, n, cols, true)
	return p == pathQGemm || p == pathQdot
}

// qgemm is MatMul through bk_qgemm_pack_x and bk_qgemm.
func (b *Backend) qgemm(out, x []float32, n int, w *kernels.Matrix, wp unsafe.Pointer, work int) {
	cols := w.Cols
	xr, put := pooled[byte](&qpacks, int(C.bk_qgemm_x_bytes(C.int64_t(n), C.int64_t(cols))))
	defer put()
	xp := (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(xr)))
	block := C.bk_quant_x_block(C.int(w.DType))
	b.parallel(n, 1, 8*n*cols, func(lo, hi int) {
		C.bk_qgemm_pack_x(xp, fptr(x), C.int64_t(cols), C.int64_t(block), C.int64_t(lo), C.int64_t(hi))
	})
	b.parallel(w.Rows, rowAlign, work, func(lo, hi int) {
		C.bk_qgemm(fptr(out), xp, C.int64_t(n), (*C.uint8_t)(wp), C.int(w.DType),
			C.int64_t(w.Rows), C.int64_t(cols), C.int64_t(lo), C.int64_t(hi))
	})
}

// qpacks holds the buffers qgemm quantises x into.
var qpacks sync.Pool

// pooled returns n elements of a buffer from p (or a new one) and the
// function that gives it back.
func pooled[T any](p *sync.Pool, n int) ([]T, func()) {
	var s []T
	if v, ok := p.Get().(*[]T); ok && cap(*v) >= n {
		s = (*v)[:n]
	} else {
		s = make([]T, n)
	}
	return s, func() { p.Put(&s) }
}

// qbufs holds the buffers x is quantised into for qdot, reused across
// products like packs.
var qbufs sync.Pool

type qbuf struct {
	qs []int8
	d  []float32
	s  []int32
}

// qdot is MatMul through bk_quant_x and bk_qdot. x is quantised by rows in
// parallel (at 32 rows of 2048 it is tens of µs, too much to leave to one
// thread ahead of every product).
func (b *Backend) qdot(out, x []float32, n int, w *kernels.Matrix, wp unsafe.Pointer, work int) {
	block := int(C.bk_quant_x_block(C.int(w.DType)))
	cols := w.Cols
	qb, _ := qbufs.Get().(*qbuf)
	if qb == nil {
		qb = &qbuf{}
	}
	defer qbufs.Put(qb)
	if cap(qb.qs) < n*cols {
		qb.qs = make([]int8, n*cols)
		qb.d = make([]float32, n*cols/32)
		qb.s = make([]int32, n*cols/32)
	}
	qp := (*C.int8_t)(unsafe.Pointer(unsafe.SliceData(qb.qs)))
	dp := fptr(qb.d)
	sp := (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(qb.s)))
	nd, nb := cols/block, cols/32
	b.parallel(n, 1, 8*n*cols, func(lo, hi int) {
		C.bk_quant_x(b.simdFlag(), (*C.int8_t)(unsafe.Add(unsafe.Pointer(qp), lo*cols)), fptr(qb.d[lo*nd:]),
			(*C.int32_t)(unsafe.Pointer(&qb.s[lo*nb])), fptr(x[lo*cols:]), C.int64_t(hi-lo), C.int64_t(cols), C.int64_t(block))
	})
	b.parallel(w.Rows, rowAlign, work, func(lo, hi int) {
		C.bk_qdot(b.simdFlag(), fptr(out), qp, dp, sp, C.int64_t(n), (*C.uint8_t)(wp),
			C.int(w.DType), C.int64_t(w.Rows), C.int64_t(w.Cols), C.int64_t(lo), C.int64_t(hi))
	})
}

// quantX is bk_quant_x on the given path (0 scalar, 1 SIMD) over n rows
// of x, for tests to set the paths against each other.
func quantX(simd int, x []float32, n, cols, block int) ([]int8, []float32, []int32) {
	qs, d, s := make([]int8, n*cols), make([]float32, n*cols/block), make([]int32, n*cols/32)
	C.bk_quant_x(C.int(simd), (*C.int8_t)(unsafe.Pointer(unsafe.SliceData(qs))), fptr(d),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(s))), fptr(x), C.int64_t(n), C.int64_t(cols), C.int64_t(block))
	return qs, d, s
}

// gemmMinN: from this many x rows on, products use the packed-x gemm;
// below, bk_matmul's dot-product kernel. With 8 or fewer rows the gemm has
// one x vector live and needs 7 loads per 6 FMAs (the dot-product kernel 7
// per 12), and from 9 to 15 rows it pads to 16; on a shared machine the
// two measured within noise of each other there, so the older kernel keeps
// the small batches.
const gemmMinN = 16

// gemmMinN512 is gemmMinN with the AVX-512 gemm, whose 16-wide panel
// columns make padding 8 rows to 16 cheaper than the 8-wide dot products
// now that it prefetches its weights (weights from memory, 2 threads, 8
// rows: F16 54-77 -> 93-106 GFLOP/s, F32 within noise to 1.7x; a 134M F32
// decode step of 8 sequences in process 30-33 -> 25-26 ms); at 5 and 6
// rows the dot products measured as fast or faster.
const gemmMinN512 = 8

// packs holds the buffers x is packed into for gemm, so a forward pass
// reuses them rather than allocating one per product.
var packs sync.Pool

// gemm is MatMul for n >= gemmMinN on the SIMD path: x is packed once (in
// parallel, by panels of 16 rows), then each range of weight rows is one C
// call that reads its weights once for all n rows.
func (b *Backend) gemm(out, x []float32, n int, w *kernels.Matrix, wp unsafe.Pointer, work int) {
	npan := (n + 15) / 16
	xp, put := pooled[float32](&packs, npan*16*w.Cols)
	defer put()
	b.parallel(npan, 1, n*w.Cols, func(lo, hi int) {
		C.bk_pack_x(b.simdFlag(), fptr(xp), fptr(x), C.int64_t(n), C.int64_t(w.Cols), C.int64_t(lo), C.int64_t(hi))
	})
	if b.splitsX(npan, w) {
		rows, cols := w.Rows, w.Cols
		b.pool.run(cut(npan, 1, b.threads), b.threads, func(lo, hi int) {
			// A thread's share is tens of ms of C: it goes a few hundred
			// rows at a time and through the scheduler between them (see
			// yieldEvery).
			for r0 := 0; r0 < rows; r0 += b.splitXRows {
				if r0 > 0 {
					runtime.Gosched()
				}
				C.bk_gemm(b.simdFlag(), fptr(out[16*lo*rows:]), fptr(xp[16*lo*cols:]), C.int64_t(min(16*hi, n)-16*lo),
					(*C.uint8_t)(wp), C.int(w.DType), C.int64_t(rows), C.int64_t(cols), C.int64_t(r0), C.int64_t(min(r0+b.splitXRows, rows)))
			}
		})
		return
	}
	align := rowAlign
	if b.simdFlag() == 2 {
		align = rowAlign512
	}
	b.parallel(w.Rows, align, work, func(lo, hi int) {
		C.bk_gemm(b.simdFlag(), fptr(out), fptr(xp), C.int64_t(n), (*C.uint8_t)(wp), C.int(w.DType),
			C.int64_t(w.Rows), C.int64_t(w.Cols), C.int64_t(lo), C.int64_t(hi))
	})
}

// gemmSplitXPanels, gemmSplitXWeights: a gemm (AVX-512 or AVX2) of at least
// gemmSplitXPanels x panels (of 16 rows) per thread and gemmSplitXWeights
// weight elements gives each thread a contiguous share of x's panels and
// every weight row, instead of a share of the weight rows and all of x.
// Each thread then keeps half the x slices in its L2 and converts every
// weight slice itself. Six interleaved rounds, F16, 512 rows, 2 threads,
// median (min-max) GFLOP/s, weight rows split -> x split: 5632x2048 297
// (293-303) -> 321 (309-321), 2048x5632 283 (276-299) -> 304 (290-316),
// 2048x2048 274 -> 276. Fewer rows (128) and the 134M's 768-wide products
// measured as fast or faster with the rows split. The AVX2 gemm gains as
// much (F16 and Q4_K, three interleaved rounds, rows split -> x split,
// GFLOP/s: F16 5632x2048 152-155 -> 178-197, 2048x5632 152-156 -> 174-189;
// Q4_K 5632x2048 146-166 -> 172-197, 2048x5632 144-147 -> 170-188).
//
// gemmSplitXRows: each thread's share is gemmSplitXRows weight rows per C
// call (a multiple of 16, and of the rows one cbuf holds at these shapes;
// 1.5-4 ms each). As one call of 30 ms per thread the share ran into the
// runtime's 10 ms preemption (see yieldEvery): F16, 512 rows, 2 threads,
// medians of four interleaved rounds (BenchmarkMatMul1B), 5632x2048 304 ->
// 344 GFLOP/s, 2048x5632 299 -> 327.
const (
	gemmSplitXPanels  = 16
	gemmSplitXWeights = 8 << 20
	gemmSplitXRows    = 256
)

// splitsX reports whether gemm splits x (not the weight rows) between the
// threads.
func (b *Backend) splitsX(npan int, w *kernels.Matrix) bool {
	return b.threads > 1 && b.simdFlag() >= 1 && b.splitXPanels > 0 && b.splitXRows > 0 &&
		npan >= b.splitXPanels*b.threads && w.Rows*w.Cols >= b.splitXWeights
}

// RMSNorm implements kernels.Backend.
func (b *Backend) RMSNorm(out, x, weight []float32, n int, eps float32) {
	d := len(weight)
	if n <= 0 || d == 0 {
		return
	}
	kernels.CheckRMSNorm(out, x, n, d)
	b.parallel(n, 1, 4*n*d, func(lo, hi int) {
		C.bk_rmsnorm(b.simdFlag(), fptr(out), fptr(x), fptr(weight), C.int64_t(d), C.float(eps),
			C.int64_t(lo), C.int64_t(hi))
	})
}

// ApplyRoPE implements kernels.Backend.
func (b *Backend) ApplyRoPE(x []float32, positions []int32, heads, headDim int, r kernels.RoPE) {
	half := r.Dim / 2
	if len(positions) == 0 || half <= 0 || heads <= 0 {
		return
	}
	kernels.CheckRoPE(x, len(positions), heads, headDim, r)
	scale := r.PositionScale()
	freq := r.Frequencies()
	neox := C.int(0)
	if r.NeoX {
		neox = 1
	}
	work := len(positions) * half * (2*heads + 500) // rotations + sin/cos
	b.parallel(len(positions), 1, work, func(lo, hi int) {
		C.bk_rope(b.simdFlag(), fptr(x), (*C.int32_t)(unsafe.Pointer(&positions[0])),
			C.int64_t(heads), C.int64_t(headDim), C.int64_t(r.Dim), neox, C.double(scale),
			(*C.double)(unsafe.Pointer(&freq[0])), C.int64_t(lo), C.int64_t(hi))
	})
}

// SwiGLU implements kernels.Backend.
func (b *Backend) SwiGLU(out, gate, up []float32) {
	n := len(gate)
	if n == 0 {
		return
	}
	kernels.CheckElementwise("SwiGLU", n, up, out)
	b.parallel(n, 64, 12*n, func(lo, hi int) {
		C.bk_swiglu(b.simdFlag(), fptr(out[lo:]), fptr(gate[lo:]), fptr(up[lo:]), C.int64_t(hi-lo))
	})
}

// Add implements kernels.Backend.
func (b *Backend) Add(out, a, bb []float32) {
	n := len(out)
	if n == 0 {
		return
	}
	kernels.CheckElementwise("Add", n, a, bb)
	b.parallel(n, 64, 3*n, func(lo, hi int) {
		C.bk_add(b.simdFlag(), fptr(out[lo:]), fptr(a[lo:]), fptr(bb[lo:]), C.int64_t(hi-lo))
	})
}

// Embed implements kernels.Backend.
func (b *Backend) Embed(out []float32, table *kernels.Matrix, ids []int32) {
	if len(ids) == 0 {
		return
	}
	kernels.CheckEmbed(out, table, ids)
	C.bk_dequant_rows(b.simdFlag(), fptr(out), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(table.Data))),
		C.int(table.DType), C.int64_t(table.Cols), (*C.int32_t)(unsafe.Pointer(&ids[0])), C.int64_t(len(ids)))
}

// StoreKV implements kernels.Backend. For F32 it is a plain copy (Go's
// memmove is as fast as anything C would do); F16 rows are rounded by
// F16C in C (in Go it was 9% of a 32-stream serving profile, on the
// engine's one goroutine), BF16 rows per element in Go.
func (b *Backend) StoreKV(kv kernels.PagedKV, layer int, slots []int32, k, v []float32) {
	kernels.CheckHostKV("the cpu backend", kv)
	kernels.CheckStoreKV(kv, layer, slots, k, v)
	rf := kv.RowFloats()
	for i, s := range slots {
		p, o := int(s)/kv.PageSize, int(s)%kv.PageSize
		b.storeRow(kv, kv.KOffset(p, layer, o), k[i*rf:(i+1)*rf])
		b.storeRow(kv, kv.VOffset(p, layer, o), v[i*rf:(i+1)*rf])
	}
}

func (b *Backend) storeRow(kv kernels.PagedKV, off int, row []float32) {
	if kv.DType != kernels.F16 {
		kv.StoreRow(off, row)
		return
	}
	dst := kv.Halves()[off : off+len(row)]
	C.bk_f32_to_f16(b.simdFlag(), (*C.uint16_t)(unsafe.Pointer(unsafe.SliceData(dst))), fptr(row), C.int64_t(len(row)))
}

// attnScratch holds what Attention describes its work in, reused from
// call to call: allocated afresh for each of a step's layers, these slices
// kept the heap churning, and memory the runtime had handed back to the OS
// faulted in again a page at a time (a quarter of the page faults of a
// 32-stream run).
type attnScratch struct {
	pages  []int32
	sdesc  []int64
	items  []int32
	cost   []int
	bounds []int
}

var attnScratches sync.Pool

// Attention implements kernels.Backend.
//
// Work is cut into items of up to C.BK_ATTN_MAX_MEMBERS (query row, query
// head) pairs that share a sequence and a KV head (a GQA group, and for
// prefill several rows), so each K/V row read serves all of them; items
// are split across threads by estimated cost.
func (b *Backend) Attention(out, q []float32, kv kernels.PagedKV, layer int, seqs []kernels.AttnSeq, heads int, scale float32) {
	if len(seqs) == 0 {
		return
	}
	kernels.CheckHostKV("the cpu backend", kv)
	kernels.CheckAttention(len(out), len(q), kv, layer, seqs, heads)
	hd := kv.HeadDim
	group := heads / kv.KVHeads
	maxMembers := int(C.BK_ATTN_MAX_MEMBERS)
	nh := min(group, maxMembers)
	rowsPer := max(1, maxMembers/nh)

	sc, _ := attnScratches.Get().(*attnScratch)
	if sc == nil {
		sc = new(attnScratch)
	}
	defer attnScratches.Put(sc)
	pages, sdesc, items, cost, total := sc.pages[:0], sc.sdesc[:0], sc.items[:0], sc.cost[:0], 0
	for si, s := range seqs {
		if s.QLen <= 0 {
			sdesc = append(sdesc, 0, 0, 0, 0)
			continue
		}
		used := (s.KVLen + kv.PageSize - 1) / kv.PageSize
		sdesc = append(sdesc, int64(len(pages)), int64(s.QStart), int64(s.QLen), int64(s.KVLen))
		pages = append(pages, s.Pages[:used]...)
		for kh := 0; kh < kv.KVHeads; kh++ {
			for h := kh * group; h < (kh+1)*group; h += nh {
				hn := min(nh, (kh+1)*group-h)
				for r := 0; r < s.QLen; r += rowsPer {
					rn := min(rowsPer, s.QLen-r)
					items = append(items, int32(si), int32(kh), int32(r), int32(rn), int32(h), int32(hn))
					c := rn * hn * (s.KVLen - s.QLen + r + (rn+1)/2) * hd
					cost = append(cost, c)
					total += c
				}
			}
		}
	}
	sc.pages, sc.sdesc, sc.items, sc.cost = pages, sdesc, items, cost // grown, for the next call
	nitems := len(cost)
	if nitems == 0 {
		return
	}
	geom := C.bk_attn_geom{
		page_floats: C.int64_t(kv.PageElems()),
		kv_dtype:    C.int(kv.DType),
		page_size:   C.int64_t(kv.PageSize),
		row_floats:  C.int64_t(kv.RowFloats()),
		layer:       C.int64_t(layer),
		head_dim:    C.int64_t(hd),
		heads:       C.int64_t(heads),
		scale:       C.float(scale),
	}
	run := func(lo, hi int) {
		if C.bk_attention(b.simdFlag(), fptr(out), fptr(q), unsafe.Pointer(unsafe.SliceData(kv.Data)),
			(*C.int32_t)(unsafe.Pointer(&pages[0])), (*C.int64_t)(unsafe.Pointer(&sdesc[0])),
			(*C.int32_t)(unsafe.Pointer(&items[0])), C.int64_t(lo), C.int64_t(hi), &geom) != 0 {
			panic("cpu: Attention out of memory")
		}
	}
	parts := min(b.threads*rangesPerThread, 2*total/b.minWork, nitems)
	if parts <= 1 || b.threads <= 1 {
		run(0, nitems)
		return
	}
	// Contiguous ranges of items with about equal cost.
	bounds := append(sc.bounds[:0], 0)
	acc, hi := 0, 0
	for p := 1; p < parts; p++ {
		target := total * p / parts
		lo := hi
		for hi < nitems && (hi == lo || acc+cost[hi] <= target) {
			acc += cost[hi]
			hi++
		}
		if hi >= nitems {
			break
		}
		bounds = append(bounds, hi)
	}
	bounds = append(bounds, nitems)
	sc.bounds = bounds
	b.pool.run(bounds, b.threads, run)
}
