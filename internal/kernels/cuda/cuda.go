// Package cuda is the NVIDIA GPU implementation of kernels.Backend.
//
// The CUDA driver (libcuda.so.1) and cuBLAS are loaded at run time with
// dlopen through hand-written prototypes (driver.h), so the package builds
// with no CUDA toolkit and a binary starts on machines without a GPU: Open
// then returns an error naming what is missing. The kernels
// (kernels/*.cu) are compiled by `make kernels` into kernels.fatbin
// (sm_80, sm_90, compute_90 PTX), committed with the hash of their sources
// (kernels.sha256) and embedded.
//
// kernels.Backend passes host slices, so the backend keeps on the device
// what lives long and copies the rest per call:
//   - weights: each *kernels.Matrix is uploaded once and cached by
//     pointer (freed when the Matrix is garbage collected);
//   - KV: the pool lives in GPU memory only (AllocKV, kv.go), as f32, f16,
//     bf16 (bf16 for --kv-cache-dtype auto) or fp8 e4m3 (converted in
//     software, kernels.F32ToE4M3's rounding); StoreKV and Attention take
//     PagedKV values whose Device is such a pool, and transfers reach its
//     pages through pinned staging buffers;
//   - activations: buffers handed to Keep (kernels.Resident, resident.go;
//     the model keeps its scratch) stay on the device, so a forward pass
//     queues its kernels back to back and copies in only token ids,
//     positions and slots and out only the last rows; any other slice is
//     copied in and out on each call.
//
// The engine's tokens are sampled on the device too (SampleRows,
// kernels.RowSampler, sample.go): the logits stay where the LM head wrote
// them, one launch takes every row of a step (a block a row: NaN flag,
// logprobs of the raw row and its top alternatives, the request's bias,
// penalties, mask and bans, then the argmax or a draw with the request's
// own random number through top-k, min-p and top-p without a sort), and
// only the choices come back; rows the host reads (prompt logprobs, a
// draft's verification) are copied out whole.
//
// Weights may be f32, f16, bf16 or any ggml block format the CPU backend
// serves (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k), kept
// on the device as stored. Products of up to 8 rows use own kernels that
// read the weights directly, dequantising block formats in registers;
// larger ones use cuBLAS: sgemm for f32 weights, GemmEx with float32
// accumulation for f16 and bf16 weights (x rounded to the weights' type),
// and for the block formats too: each product dequantises the weight to
// f16 in row chunks of a scratch buffer (bk_dequant_rows_f16, at most
// 64 MB) and runs GemmEx over them with x rounded to f16. The trade-off:
// each such product writes and reads 2 bytes a weight more than a
// resident f16 copy would (small next to the product's arithmetic from a
// few dozen rows up), while a resident copy would hold 2 bytes a weight
// on top of the quantised one (3.6 times a Q4_K matrix), the memory the
// format was chosen to save. f16 rather than bf16: decoded weights and
// normalised activations fit its range, and it keeps 3 more bits (a term
// is off by about 2^-10 of its size, x and w each rounded once).
// Without a loadable cuBLAS every product uses the own kernels.
//
// Where a GemmEx product's input comes from: the kernel that writes it
// (RMSNorm alone or after the residual add, SwiGLU, and the tensor-core
// prompt attention) writes its half copy too, in the same pass, so no
// cast kernel runs before a product (halfShadow). What stays float32 and
// why: the residual stream (a sum over every layer, where f16's 11 bits
// would drift), the norms' sums and scale (float64, as ref), RoPE's
// rotation, attention's q and softmax (rounded to half only inside the
// tensor-core tiles), the products' accumulation and outputs, and the
// logits. Each value is rounded at most once before its product, as the
// cast it replaces did, so the results are bit for bit the same
// (TestFakeHalfShadow) and the parity tolerances are unchanged. Inputs
// of gemv products (up to 8 rows) stay float32: those kernels read each
// once, next to every byte of the weights.
//
// A mixture of experts' FFN runs whole on the device (Experts, moe.go):
// the model routes on the host from the router's logits and hands over
// the choice; the rows are gathered by expert, each product runs over all
// experts of up to 8 rows in one launch of the same gemv code (cuBLAS per
// expert beyond, as MatMul chooses), and each row's weighted outputs are
// summed in pick order by one kernel without atomics.
//
// Attention takes two paths in one call. Prompt chunks (QLen >= 16) over
// an f16 or bf16 pool at head dim 64, 128 or 256 go to
// kernels/attn_mma.cuh: FlashAttention-2 style tiles of 64 query rows and
// 64 positions (32 at head dim 256, where registers are short), K and V
// gathered through the page table into shared memory, Q·Kᵀ and P·V on
// the tensor cores (mma.sync m16n8k16, q and P rounded to the pool's half
// type), online softmax, over the request's earlier pages too. Everything
// else (decode rows, short chunks, f32 pools, other head dims up to 256)
// goes to kernels/attention.cuh: coalesced row reads shared by a GQA
// group, positions split across blocks from the SM count
// (flash-decoding).
//
// The backend runs on the device's primary context, on a stream of its
// own (each KV pool's page copies on another). The KV pool must fit in
// GPU memory next to the weights (size it with --kv-cache-memory).
//
// The tests run everything on a fake libcuda/libcublas built from
// testdata/fakecuda, which executes the same kernels on the CPU (the
// tensor-core mma through a faithful warp-wide twin in bk_emu.h, so the
// fragment layouts are checked too); the TestGPU* tests and benchmarks
// need a real GPU (test/gpu/run.sh).
//
// A Backend is safe for concurrent use (calls are serialised). Driver
// failures inside kernels.Backend methods panic, as invalid arguments do
// in the CPU backend.
package cuda

/*
#include <stdlib.h>
#include "driver.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
	"weak"

	"github.com/batonlm/baton/internal/kernels"
)

// Geometry shared with the kernels (kernels/*.cuh).
const (
	gemvMaxN       = 8   // BK_GEMV_MAXN
	gemvWarps      = 4   // BK_GEMV_WARPS
	attnThreads    = 128 // BK_ATTN_THREADS
	attnWarps      = attnThreads / 32
	attnMaxMembers = 8   // BK_ATTN_MAX_MEMBERS
	attnMaxHD      = 256 // BK_ATTN_MAX_HD
	attnItemFields = 6
	attnSeqFields  = 4
	// The tensor-core prompt attention (attn_mma.cuh): a block's query
	// rows (BK_MMA_ROWS), positions a K/V tile (BK_MMA_POS; at head dim
	// 256 BK_MMA_POS_HD256), the int32 fields of a tile, and the least
	// QLen sent to it.
	mmaThreads    = 128
	mmaRows       = 64
	mmaPos        = 64
	mmaPosHD256   = 32
	mmaPad        = 8
	mmaTileFields = 2
	mmaMinQLen    = 16
	elemThreads   = 256
	maxGrid       = 1 << 20 // grid-stride kernels use at most this many blocks
	// stageBytes is the pinned host buffer small copies to the device go
	// through; stageMax the largest copy that does.
	stageBytes = 4 << 20
	stageMax   = 1 << 20
	// dequantChunk bounds the scratch of a cuBLAS product over a block
	// format (floats; twice as many halves): 64 MB.
	dequantChunk = 16 << 20
	// attnSplitLen is the least positions per split of one attention item:
	// a block's groups take them a few at a time, and fewer would leave
	// most of its warps idle.
	attnSplitLen = 32
	// attnBlocksPerSM is how many attention blocks per SM the splits aim
	// for: enough resident warps to keep the loads in flight.
	attnBlocksPerSM = 4
	// attnMaxSplits bounds the splits of one item (and so the partial
	// results the combine step reads).
	attnMaxSplits = 128
)

// Kernel indices; kernelNames must match BK_KERNELS in kernels/baton.cu.
const (
	kGemvF32 = iota
	kGemvF16
	kGemvBF16
	kGemvQ80
	kDequantRows
	kToF16
	kToBF16
	kRMSNorm
	kAddRMSNorm
	kRoPE
	kSwiGLU
	kAdd
	kGatherRows
	kStoreKV
	kRoPEStoreKV
	kPagePack
	kPageUnpack
	kPageSum
	kAttnF32M4
	kAttnF16M4
	kAttnBF16M4
	kAttnF32M8
	kAttnF16M8
	kAttnBF16M8
	kAttnCombine
	kMoEGather
	kMoEGemv
	kMoEScatter
	kGemvQ40
	kGemvQ41
	kGemvQ50
	kGemvQ51
	kGemvQ4K
	kGemvQ5K
	kGemvQ6K
	kGemvQ3K
	kGemvQ2K
	kSample
	kAttnMMAF16HD64 // attn_mma.cuh: by half type, then head dim (attnMMAKernel)
	kAttnMMABF16HD64
	kAttnMMAF16HD128
	kAttnMMABF16HD128
	kAttnMMAF16HD256
	kAttnMMABF16HD256
	kDequantRowsF16
	kAttnE4M3M4
	kAttnE4M3M8
	kAttnMMAE4M3HD64
	kAttnMMAE4M3HD128
	kAttnMMAE4M3HD256
	numKernels
)

// launchOp names each kernel's launch in errors, made once: a launch
// must not allocate.
var launchOp = func() (ops [numKernels]string) {
	for k, n := range kernelNames {
		ops[k] = "cuLaunchKernel " + n
	}
	return ops
}()

var kernelNames = [numKernels]string{
	"bk_gemv_f32", "bk_gemv_f16", "bk_gemv_bf16", "bk_gemv_q8_0", "bk_dequant_rows", "bk_f32_to_f16",
	"bk_f32_to_bf16", "bk_rmsnorm", "bk_add_rmsnorm", "bk_rope", "bk_swiglu", "bk_add", "bk_gather_rows", "bk_store_kv",
	"bk_rope_store_kv", "bk_page_pack",
	"bk_page_unpack", "bk_page_sum", "bk_attn_f32_m4", "bk_attn_f16_m4", "bk_attn_bf16_m4", "bk_attn_f32_m8", "bk_attn_f16_m8",
	"bk_attn_bf16_m8", "bk_attn_combine", "bk_moe_gather", "bk_moe_gemv", "bk_moe_scatter",
	"bk_gemv_q4_0", "bk_gemv_q4_1", "bk_gemv_q5_0", "bk_gemv_q5_1", "bk_gemv_q4_k", "bk_gemv_q5_k", "bk_gemv_q6_k",
	"bk_gemv_q3_k", "bk_gemv_q2_k",
	"bk_sample", "bk_attn_mma_f16_hd64", "bk_attn_mma_bf16_hd64", "bk_attn_mma_f16_hd128", "bk_attn_mma_bf16_hd128",
	"bk_attn_mma_f16_hd256", "bk_attn_mma_bf16_hd256", "bk_dequant_rows_f16", "bk_attn_e4m3_m4", "bk_attn_e4m3_m8",
	"bk_attn_mma_e4m3_hd64", "bk_attn_mma_e4m3_hd128", "bk_attn_mma_e4m3_hd256",
}

// gemvKernel is the gemv kernel of each weight dtype (SupportsDType).
var gemvKernel = [...]int{
	kernels.F32: kGemvF32, kernels.F16: kGemvF16, kernels.BF16: kGemvBF16, kernels.Q8_0: kGemvQ80,
	kernels.Q4_0: kGemvQ40, kernels.Q4_1: kGemvQ41, kernels.Q5_0: kGemvQ50, kernels.Q5_1: kGemvQ51,
	kernels.Q4_K: kGemvQ4K, kernels.Q5_K: kGemvQ5K, kernels.Q6_K: kGemvQ6K, kernels.Q3_K: kGemvQ3K,
	kernels.Q2_K: kGemvQ2K,
}

// Scratch buffers for per-call data, by role.
const (
	sX = iota
	sX2
	sOut
	sVec
	sHalf
	sDequant
	sPart
	sIdx1
	// Tables a step's layers share: each layer's call passes the same
	// values, uploaded once (uploadSame).
	sPositions
	sFreq
	sSlots
	sPages
	sSeqs
	sItems
	sTiles    // Attention: the tensor-core kernel's (sequence, first row) tiles
	sMoERoute // Experts: slot rows, pick slots and weights
	sMoESeg   // Experts: the segment table
	sMoEX     // Experts: x gathered by slot
	sMoEGate  // Experts: gate products, then SwiGLU
	sMoEUp    // Experts: up products
	sMoEY     // Experts: down products
	sSample   // SampleRows: row descriptors
	sSampleE  // SampleRows: edits
	sSampleB  // SampleRows: bans
	sSampleA  // SampleRows: allow masks
	sSampleW  // SampleRows: adjusted rows
	sSampleO  // SampleRows: results
	numScratch
)

type dptr = uint64

type devBuf struct {
	ptr  dptr
	size int
}

type devMatrix struct {
	ptr        dptr
	dtype      kernels.DType
	rows, cols int
	bytes      int
}

// pendingFree is device memory whose host owner (a weight's Matrix, a
// kept activation buffer) was garbage collected; freed at the start of the
// next call (cleanups run on their own goroutine, without the context).
type pendingFree struct {
	matrix weak.Pointer[kernels.Matrix]
	act    *keptBuf
}

// Backend runs kernels.Backend on one GPU.
type Backend struct {
	mu   sync.Mutex
	drv  *driver
	info deviceInfo
	// driverVersion is the driver API version, e.g. 12040 for CUDA 12.4.
	driverVersion int
	ctx           uintptr
	// primaryCtx: ctx is the device's primary context (retained; Close
	// releases it), not one of our own.
	primaryCtx bool
	mod        uintptr
	stream     uintptr
	fn         [numKernels]uintptr
	closed     bool

	blas     *C.bk_cublas
	blasH    uintptr
	blasDesc string
	// blasWork is cuBLAS's workspace (setBLASWorkspace), 0 when it has
	// none of ours; blasNoCapture then says why.
	blasWork      dptr
	blasNoCapture string

	scratch [numScratch]devBuf
	// stage is pinned host memory (nil when the driver refused it) that
	// copies of up to stageMax bytes to the device are made from: a copy
	// from pageable memory first waits for every kernel queued on the
	// stream, one from pinned memory does not, so a step's small inputs no
	// longer stall the GPU. staged bytes of it are in use by copies that
	// may still be queued; the stream's next synchronisation frees them.
	stage  unsafe.Pointer
	staged int
	// sent is, per scratch buffer written by uploadSame, the bytes last
	// copied into it (nil: none, or since overwritten).
	sent    [numScratch][]byte
	weights map[weak.Pointer[kernels.Matrix]]*devMatrix
	pools   map[*KVPool]struct{}
	// stores counts StoreKV calls queued; storesDone is the count at the
	// start of the last completed stream sync (all of those have run).
	stores, storesDone atomic.Uint64
	kept               map[uintptr]*keptBuf // by the host slice's address
	hostQ              []float32            // Attention: gathered q rows / compact output
	attnPlan           attnPlan             // Attention: the call's plan, its slices reused
	rope               ropeFreqs            // ropeArgs: the last rotation's frequencies
	args               []uint64

	freeMu  sync.Mutex
	pending []pendingFree

	// Tuning, and switches the tests flip.
	gemvMax      int  // products of at most this many rows use the gemv kernels (Experts: segments)
	exactGEMM    bool // f16/bf16 and block-format products via float32 dequantisation + sgemm, not GemmEx
	forceSplits  int  // attention: cut every item into this many parts (0: choose)
	noAttnMMA    bool // attention: prompt chunks too use attention.cuh, not the tensor cores
	exactScratch bool // scratch buffers of exactly the size asked (the fake driver's guard pages then catch overruns)
	noHalfShadow bool // products round their inputs with a cast kernel each, as before halfShadow

	moe    moePlan    // Experts' host tables, reused between calls
	sample samplePlan // SampleRows' host tables, likewise
	// halfOf is what scratch sHalf holds: x (a device address) rounded to
	// a half type for a GemmEx product, n*cols elements of it. Products
	// of one input in a row (Q, K and V; gate and up) round it once. Any
	// launch or copy to the device may change x, so both forget it.
	halfOf struct {
		x     dptr
		elems int
		conv  int
	}
	// lastConv is the rounding (kToF16, kToBF16) of the last GemmEx
	// product's input, 0 before any: halfShadow's guess at the next;
	// lastRows is the last product's rows, SwiGLU's guess at the next's.
	lastConv, lastRows int
	// Counts the tests read: Experts calls, and bytes copied to the device.
	expertCalls, h2dBytes, h2dCopies, stagedCopies int
	launches                                       [numKernels]int

	g graphState // decode steps as CUDA graphs (graph.go)
}

var _ kernels.Backend = (*Backend)(nil)
var _ kernels.KVDTyper = (*Backend)(nil)

// Open starts the backend on GPU deviceIndex. The error says what is
// missing: "libcuda.so.1 not found", "no CUDA device", "driver too old
// (CUDA X.Y, need 11.8)", a GPU older than sm_80, or kernels not built.
func Open(deviceIndex int) (*Backend, error) { return open(defaultLibs(), deviceIndex) }

// Probe describes the driver and its GPUs in one line, without creating a
// context, e.g. "cuda driver 12.4 (libcuda.so.1), 1 device: [0] NVIDIA
// H200 (sm_90, 132 SMs, 139.8 GiB)".
func Probe() (string, error) { return probe(defaultLibs()) }

func probe(l libs) (string, error) {
	d, ver, err := initDriver(l.driver)
	if err != nil {
		return "", err
	}
	n := d.deviceCount()
	var devs []string
	for i := 0; i < n; i++ {
		info, err := d.device(i)
		if err != nil {
			return "", err
		}
		devs = append(devs, fmt.Sprintf("[%d] %s", i, info))
	}
	plural := "s"
	if n == 1 {
		plural = ""
	}
	return fmt.Sprintf("cuda driver %s (%s), %d device%s: %s; %s", versionString(ver), d.name, n, plural,
		strings.Join(devs, ", "), d.features()), nil
}

func open(l libs, index int) (*Backend, error) {
	d, ver, err := initDriver(l.driver)
	if err != nil {
		return nil, err
	}
	if n := d.deviceCount(); index < 0 || index >= n {
		return nil, fmt.Errorf("cuda: no CUDA device %d (%d present)", index, n)
	}
	info, err := d.device(index)
	if err != nil {
		return nil, err
	}
	if info.major < 8 {
		return nil, fmt.Errorf("cuda: %s is sm_%d%d; the kernels need sm_80 or newer", info.name, info.major, info.minor)
	}
	if len(fatbin) == 0 {
		return nil, errors.New("cuda: kernels not built (run make kernels)")
	}
	b := &Backend{drv: d, driverVersion: ver, info: info, weights: map[weak.Pointer[kernels.Matrix]]*devMatrix{},
		pools: map[*KVPool]struct{}{}, kept: map[uintptr]*keptBuf{}, gemvMax: gemvMaxN}
	b.g.maxBS = DefaultGraphMaxBS
	b.dropGraphs()

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ctx C.uintptr_t
	var primary C.int
	r := C.bk_ctx_create(d.c, &ctx, info.dev, &primary)
	if r == C.BK_ERR_MISSING {
		return nil, fmt.Errorf("cuda: %s lacks cuDevicePrimaryCtxRetain and cuCtxCreate_v2", d.name)
	}
	if err := d.check("cuDevicePrimaryCtxRetain (or cuCtxCreate_v2)", r); err != nil {
		return nil, err
	}
	b.ctx, b.primaryCtx = uintptr(ctx), primary != 0
	if err := d.check("cuCtxSetCurrent", C.bk_ctx_set(d.c, ctx)); err != nil {
		b.release()
		return nil, err
	}
	fail := func(err error) (*Backend, error) {
		b.release()
		return nil, err
	}
	var mod C.uintptr_t
	if err := d.check("cuModuleLoadData", C.bk_module_load(d.c, &mod, unsafe.Pointer(unsafe.SliceData(fatbin)))); err != nil {
		return fail(fmt.Errorf("cuda: loading kernels.fatbin on %s: %w", info, err))
	}
	b.mod = uintptr(mod)
	for i, name := range kernelNames {
		cname := C.CString(name)
		var fn C.uintptr_t
		r := C.bk_module_function(d.c, &fn, mod, cname)
		C.free(unsafe.Pointer(cname))
		if err := d.check("cuModuleGetFunction "+name, r); err != nil {
			return fail(err)
		}
		b.fn[i] = uintptr(fn)
	}
	var s C.uintptr_t
	if err := d.check("cuStreamCreate", C.bk_stream_create(d.c, &s)); err != nil {
		return fail(err)
	}
	b.stream = uintptr(s)
	var h unsafe.Pointer
	if C.bk_host_alloc(d.c, &h, C.size_t(stageBytes)) == 0 {
		b.stage = h
	}
	b.openCUBLAS(l.cublas)
	return b, nil
}

// openCUBLAS takes the first cuBLAS that loads and creates a handle on
// the backend's context; without one, products use the own kernels.
func (b *Backend) openCUBLAS(names []string) {
	var reasons []string
	for _, name := range names {
		lib, err := loadCUBLAS(name)
		if err != nil {
			if len(reasons) == 0 {
				reasons = append(reasons, err.Error())
			}
			continue
		}
		var h C.uintptr_t
		if err := blasCheck("cublasCreate ("+name+")", C.bk_blas_create(lib, &h)); err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		if err := blasCheck("cublasSetStream", C.bk_blas_set_stream(lib, h, C.uintptr_t(b.stream))); err != nil {
			C.bk_blas_destroy(lib, h)
			reasons = append(reasons, err.Error())
			continue
		}
		b.blas, b.blasH = lib, uintptr(h)
		b.setBLASWorkspace()
		b.blasDesc = "cublas " + name
		var v C.int
		if C.bk_blas_version(lib, h, &v) == 0 {
			b.blasDesc = fmt.Sprintf("cublas %d.%d (%s)", v/10000, v%10000/100, name)
		}
		return
	}
	b.blasDesc = "no cublas (" + strings.Join(reasons, "; ") + "): own kernels for every product"
}

// blasWorkspaceBytes is the workspace cuBLAS gets: what it recommends on
// sm_90, more than it needs elsewhere.
const blasWorkspaceBytes = 32 << 20

// setBLASWorkspace gives cuBLAS a workspace of ours. Left to itself cuBLAS
// may allocate one at a product's first call, and an allocation inside a
// stream capture spoils it: only with a workspace set may a graph step
// hold cuBLAS products (blasNoCapture says why not). cublasSetStream drops
// the workspace, so this comes after it.
func (b *Backend) setBLASWorkspace() {
	if C.bk_blas_has_workspace(b.blas) == 0 {
		b.blasNoCapture = "this cuBLAS lacks cublasSetWorkspace_v2"
		return
	}
	var p C.bk_dptr
	if r := C.bk_mem_alloc(b.drv.c, &p, blasWorkspaceBytes); r != 0 {
		b.blasNoCapture = "allocating its workspace: " + b.drv.errText(r)
		return
	}
	if err := blasCheck("cublasSetWorkspace", C.bk_blas_set_workspace(b.blas, C.uintptr_t(b.blasH), p, blasWorkspaceBytes)); err != nil {
		C.bk_mem_free(b.drv.c, p)
		b.blasNoCapture = err.Error()
		return
	}
	b.blasWork = dptr(p)
}

// Name implements kernels.Backend.
func (*Backend) Name() string { return "cuda" }

// Describe is a one-line description of the device and libraries, for logs.
func (b *Backend) Describe() string {
	return fmt.Sprintf("%s, driver CUDA %s, %s", b.info, versionString(b.driverVersion), b.blasDesc)
}

// Close frees everything on the device. The backend must not be used after.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	C.bk_ctx_set(b.drv.c, C.uintptr_t(b.ctx))
	b.release()
	b.closed = true
	return nil
}

// release frees what open made, on the current thread with the context current.
func (b *Backend) release() {
	d := b.drv.c
	if b.ctx == 0 {
		return
	}
	if b.stream != 0 {
		C.bk_stream_sync(d, C.uintptr_t(b.stream))
	}
	b.g.rec = nil
	for _, g := range b.g.graphs {
		b.destroyGraph(g)
	}
	b.g.graphs = nil
	for _, m := range b.weights {
		C.bk_mem_free(d, C.bk_dptr(m.ptr))
	}
	for kp := range b.pools {
		kp.release()
	}
	for _, e := range b.kept {
		C.bk_mem_free(d, C.bk_dptr(e.dev))
	}
	for i := range b.scratch {
		if b.scratch[i].ptr != 0 {
			C.bk_mem_free(d, C.bk_dptr(b.scratch[i].ptr))
		}
	}
	b.weights, b.pools, b.kept, b.scratch = nil, nil, nil, [numScratch]devBuf{}
	if b.stage != nil {
		C.bk_host_free(d, b.stage)
		b.stage = nil
	}
	if b.blasH != 0 {
		C.bk_blas_destroy(b.blas, C.uintptr_t(b.blasH))
		b.blasH = 0
	}
	if b.blasWork != 0 {
		C.bk_mem_free(d, C.bk_dptr(b.blasWork))
		b.blasWork = 0
	}
	if b.stream != 0 {
		C.bk_stream_destroy(d, C.uintptr_t(b.stream))
		b.stream = 0
	}
	if b.mod != 0 {
		C.bk_module_unload(d, C.uintptr_t(b.mod))
		b.mod = 0
	}
	primary := C.int(0)
	if b.primaryCtx {
		primary = 1
	}
	C.bk_ctx_destroy(d, C.uintptr_t(b.ctx), b.info.dev, primary)
	b.ctx = 0
}

// lock starts a call: the backend's mutex, this OS thread, the context
// current on it. Every call ends with unlock.
func (b *Backend) lock() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		panic("cuda: backend used after Close")
	}
	runtime.LockOSThread()
	if err := b.drv.check("cuCtxSetCurrent", C.bk_ctx_set(b.drv.c, C.uintptr_t(b.ctx))); err != nil {
		runtime.UnlockOSThread()
		b.mu.Unlock()
		panic(err)
	}
	b.freePending()
}

func (b *Backend) unlock() {
	runtime.UnlockOSThread()
	b.mu.Unlock()
}

// TotalMemory is the device's memory, what --mem-fraction-static is a
// fraction of.
func (b *Backend) TotalMemory() (int64, error) {
	b.lock()
	defer b.unlock()
	var free, total C.size_t
	if err := b.drv.check("cuMemGetInfo", C.bk_mem_info(b.drv.c, &free, &total)); err != nil {
		return 0, err
	}
	return int64(total), nil
}

// must panics with a driver error.
func (b *Backend) must(op string, r C.bk_res) {
	if err := b.drv.check(op, r); err != nil {
		panic(err)
	}
}

// alloc allocates device memory; out of memory names what and how much.
func (b *Backend) alloc(bytes int, what string) dptr {
	var p C.bk_dptr
	if r := C.bk_mem_alloc(b.drv.c, &p, C.size_t(max(bytes, 1))); r != 0 {
		var free, total C.size_t
		C.bk_mem_info(b.drv.c, &free, &total)
		panic(fmt.Errorf("cuda: allocating %d MiB for %s on %s (%d MiB free of %d): %s",
			bytes>>20, what, b.info.name, uint64(free)>>20, uint64(total)>>20, b.drv.errText(r)))
	}
	return dptr(p)
}

func (b *Backend) free(p dptr) {
	if p != 0 {
		b.must("cuMemFree", C.bk_mem_free(b.drv.c, C.bk_dptr(p)))
	}
}

// buf returns scratch buffer i with room for bytes.
func (b *Backend) buf(i, bytes int) dptr {
	s := &b.scratch[i]
	if s.ptr != 0 && (s.size >= bytes && !b.exactScratch || s.size == bytes) {
		return s.ptr
	}
	if s.ptr != 0 {
		// Calls queue their kernels without waiting: one still queued may
		// read this buffer (or one of a graph step, not queued yet).
		b.halfOf.x = 0
		if r := b.g.rec; r != nil {
			r.frees = append(r.frees, s.ptr)
		} else {
			b.sync()
			b.free(s.ptr)
		}
		s.ptr = 0
	}
	b.sent[i] = nil
	size := bytes
	if !b.exactScratch {
		size = max(bytes, s.size+s.size/2)
		size = (size + 4095) &^ 4095
	}
	s.ptr, s.size = b.alloc(size, "scratch"), size
	return s.ptr
}

func (b *Backend) h2d(dst dptr, src unsafe.Pointer, bytes int) {
	b.halfOf.x = 0
	b.h2dBytes += bytes
	if bytes <= 0 {
		return
	}
	b.h2dCopies++
	if r := b.g.rec; r != nil {
		r.copyTo(dst, src, bytes, bytes)
		return
	}
	b.h2dNow(dst, src, bytes)
}

// h2dNow queues a copy to the device, through the pinned stage when small.
func (b *Backend) h2dNow(dst dptr, src unsafe.Pointer, bytes int) {
	if b.stage != nil && bytes <= stageMax {
		if b.staged+bytes > stageBytes {
			b.sync() // every staged copy has run
		}
		at := unsafe.Add(b.stage, b.staged)
		copy(unsafe.Slice((*byte)(at), bytes), unsafe.Slice((*byte)(src), bytes))
		b.staged += roundUp(bytes, 256)
		b.stagedCopies++
		src = at
	}
	b.must("cuMemcpyHtoDAsync", C.bk_htod(b.drv.c, C.bk_dptr(dst), src, C.size_t(bytes), C.uintptr_t(b.stream)))
}

// d2h copies to the host and waits for it.
func (b *Backend) d2h(dst unsafe.Pointer, src dptr, bytes int) {
	b.flush()
	if bytes > 0 {
		b.must("cuMemcpyDtoHAsync", C.bk_dtoh(b.drv.c, dst, C.bk_dptr(src), C.size_t(bytes), C.uintptr_t(b.stream)))
	}
	b.sync()
}

func (b *Backend) sync() {
	b.flush()
	b.g.syncs++
	stores := b.stores.Load()
	b.must("cuStreamSynchronize", C.bk_stream_sync(b.drv.c, C.uintptr_t(b.stream)))
	b.storesDone.Store(stores) // only this thread (holding mu) moves it
	b.staged = 0
}

// upload copies a host slice into scratch buffer i.
func upload[T any](b *Backend, i int, s []T) dptr {
	bytes := len(s) * int(unsafe.Sizeof(*new(T)))
	src := unsafe.Pointer(unsafe.SliceData(s))
	if b.g.rec != nil {
		// A graph step copies its tables at their rounded size: the
		// next step's may be a little longer and still fit its program.
		n := tableBytes(bytes)
		p := b.buf(i, n)
		if r := b.g.rec; r != nil { // buf may have flushed it
			b.halfOf.x = 0
			b.h2dBytes += n
			b.h2dCopies++
			r.copyTo(p, src, bytes, n)
			return p
		}
		b.h2d(p, src, bytes)
		return p
	}
	p := b.buf(i, bytes)
	b.h2d(p, src, bytes)
	return p
}

// uploadSame is upload for tables every layer of a step passes again
// (positions, slots, attention's page tables): when scratch buffer i
// already holds these bytes the copy is skipped. A copy from pageable
// memory waits for the stream's queued kernels before it starts, so one
// per table per step, rather than one per layer, is what lets a step's
// kernels queue back to back.
func uploadSame[T any](b *Backend, i int, s []T) dptr {
	bytes := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(*new(T))))
	if b.sent[i] != nil && b.scratch[i].ptr != 0 && string(b.sent[i]) == string(bytes) {
		return b.scratch[i].ptr
	}
	p := upload(b, i, s)
	b.sent[i] = append(b.sent[i][:0], bytes...)
	return p
}

func download(b *Backend, dst []float32, src dptr) {
	b.d2h(unsafe.Pointer(unsafe.SliceData(dst)), src, 4*len(dst))
}

// Kernel arguments: each in an 8-byte slot.
func argI(v int) uint64     { return uint64(int64(v)) }
func argF(v float32) uint64 { return uint64(math.Float32bits(v)) }
func argD(v float64) uint64 { return math.Float64bits(v) }
func blocks(n, per int) int { return min((n+per-1)/per, maxGrid) }
func roundUp(n, to int) int { return (n + to - 1) / to * to }

// launch runs kernel k on a grid of gx*gy blocks of bx threads.
func (b *Backend) launch(k, gx, gy, bx, smem int, args ...uint64) {
	if gx <= 0 || gy <= 0 {
		return
	}
	b.launches[k]++
	b.halfOf.x = 0
	if r := b.g.rec; r != nil {
		r.launch(k, gx, gy, bx, smem, args)
		return
	}
	b.launchNow(k, gx, gy, bx, smem, args)
}

func (b *Backend) launchNow(k, gx, gy, bx, smem int, args []uint64) {
	b.args = append(b.args[:0], args...)
	b.must(launchOp[k], C.bk_launch(b.drv.c, C.uintptr_t(b.fn[k]), C.uint(gx), C.uint(gy),
		C.uint(bx), C.uint(smem), C.uintptr_t(b.stream), (*C.uint64_t)(unsafe.Pointer(&b.args[0])), C.int(len(args))))
}

// ---- weights ----

// AutoKVDType implements kernels.KVDTyper: bf16, half the bytes attention
// reads and the handoff moves, with f32's range (every GPU the kernels run
// on, sm_80 and newer, converts bf16 in hardware).
func (*Backend) AutoKVDType() kernels.DType { return kernels.BF16 }

// SupportsKVDType implements kernels.KVDTypeSupporter: f32, f16, bf16
// and fp8 e4m3, which the kernels convert in software (so every GPU they
// run on serves it, sm_80 as well as sm_89 and newer).
func (*Backend) SupportsKVDType(d kernels.DType) bool { return kernels.ValidKVDType(d) }

// SupportsDType implements kernels.DTypeSupporter: the kernels cover the
// float types and every ggml block format the CPU backend serves.
func (*Backend) SupportsDType(dt kernels.DType) bool {
	return dt >= 0 && int(dt) < len(gemvKernel)
}

// weight returns the device copy of w, uploading it the first time.
func (b *Backend) weight(w *kernels.Matrix) *devMatrix {
	key := weak.Make(w)
	if m := b.weights[key]; m != nil {
		return m
	}
	if err := w.Validate(); err != nil {
		panic(err)
	}
	if !b.SupportsDType(w.DType) {
		panic(fmt.Sprintf("cuda: %s weights are not supported on this backend; use --device cpu", w.DType))
	}
	m := &devMatrix{dtype: w.DType, rows: w.Rows, cols: w.Cols, bytes: len(w.Data)}
	m.ptr = b.alloc(m.bytes, fmt.Sprintf("a %dx%d %s weight", w.Rows, w.Cols, w.DType))
	b.h2d(m.ptr, unsafe.Pointer(unsafe.SliceData(w.Data)), m.bytes)
	b.weights[key] = m
	runtime.AddCleanup(w, b.queueFree, pendingFree{matrix: key})
	return m
}

// Preload uploads weight matrices now rather than at their first use.
func (b *Backend) Preload(ms ...*kernels.Matrix) (err error) {
	defer catch(&err)
	b.lock()
	defer b.unlock()
	for _, m := range ms {
		if m != nil {
			b.weight(m)
		}
	}
	b.sync()
	return nil
}

// catch turns a panic of the backend into an error (for methods that
// return one).
func catch(err *error) {
	if r := recover(); r != nil {
		if e, ok := r.(error); ok {
			*err = e
			return
		}
		*err = fmt.Errorf("%v", r)
	}
}

func (b *Backend) queueFree(p pendingFree) {
	b.freeMu.Lock()
	b.pending = append(b.pending, p)
	b.freeMu.Unlock()
}

// freePending frees what cleanups queued. It runs inside lock, before the
// caller can unlock on a panic, so it does not panic: a device that fails
// here fails the next call.
func (b *Backend) freePending() {
	b.freeMu.Lock()
	p := b.pending
	b.pending = nil
	b.freeMu.Unlock()
	if len(p) == 0 {
		return
	}
	d := b.drv.c
	b.flush()
	C.bk_stream_sync(d, C.uintptr_t(b.stream)) // queued kernels may still read them
	for _, f := range p {
		if m := b.weights[f.matrix]; m != nil {
			delete(b.weights, f.matrix)
			C.bk_mem_free(d, C.bk_dptr(m.ptr))
		}
		if f.act != nil {
			b.forget(f.act)
		}
	}
}

// ---- kernels.Backend ----

// MatMul implements kernels.Backend.
func (b *Backend) MatMul(out, x []float32, n int, w *kernels.Matrix) {
	if n <= 0 {
		return
	}
	kernels.CheckMatMul(out, x, n, w)
	b.lock()
	defer b.unlock()
	m := b.weight(w)
	dx := b.in(sX, x[:n*w.Cols])
	do, done := b.out(sOut, out, n*w.Rows)
	b.matmul(do, dx, n, m)
	b.wrote(done)
}

// matmul: out[n, rows] = x[n, cols] · wᵀ on the device.
func (b *Backend) matmul(out, x dptr, n int, w *devMatrix) {
	rows, cols := w.rows, w.cols
	b.lastRows = n
	// A cuBLAS product writes out without a launch: a rounded input it
	// overwrites is forgotten.
	if h := b.halfOf; h.x != 0 && out < h.x+uint64(4*h.elems) && h.x < out+uint64(4*n*rows) {
		b.halfOf.x = 0
	}
	if n <= b.gemvMax || b.blas == nil {
		k := gemvKernel[w.dtype]
		for i := 0; i < n; i += gemvMaxN {
			m := min(gemvMaxN, n-i)
			b.launch(k, (rows+gemvWarps-1)/gemvWarps, 1, 32*gemvWarps, 0,
				out+uint64(4*i*rows), x+uint64(4*i*cols), argI(m), w.ptr, argI(rows), argI(cols))
		}
		return
	}
	switch {
	case w.dtype == kernels.F32:
		b.sgemm(out, rows, n, cols, w.ptr, x, rows)
	case (w.dtype == kernels.F16 || w.dtype == kernels.BF16) && !b.exactGEMM:
		conv, typ := kToF16, 2 // CUDA_R_16F
		if w.dtype == kernels.BF16 {
			conv, typ = kToBF16, 14 // CUDA_R_16BF
		}
		b.gemmEx(out, rows, n, cols, w.ptr, b.halfX(x, n*cols, conv), typ, rows)
	case w.dtype.Quantized() && !b.exactGEMM:
		xh := b.halfX(x, n*cols, kToF16)
		chunk := max(1, min(rows, 2*dequantChunk/cols))
		deq := b.buf(sDequant, 2*chunk*cols)
		for r0 := 0; r0 < rows; r0 += chunk {
			cr := min(chunk, rows-r0)
			h := b.halfOf
			b.launch(kDequantRowsF16, blocks(cr*cols/8, elemThreads), 1, elemThreads, 0, deq, w.ptr,
				argI(int(w.dtype)), argI(cols), argI(r0), argI(cr))
			b.halfOf = h // the launch wrote deq only: xh still holds x
			b.gemmEx(out+uint64(4*r0), cr, n, cols, deq, xh, 2 /* CUDA_R_16F */, rows)
		}
	default: // exact products: float32 rows in chunks, then sgemm
		chunk := max(1, min(rows, dequantChunk/cols))
		deq := b.buf(sDequant, 4*chunk*cols)
		for r0 := 0; r0 < rows; r0 += chunk {
			cr := min(chunk, rows-r0)
			b.launch(kDequantRows, blocks(dequantThreads(w.dtype, cr*cols), elemThreads), 1, elemThreads, 0, deq, w.ptr,
				argI(int(w.dtype)), argI(cols), 0, argI(r0), argI(cr))
			b.sgemm(out+uint64(4*r0), cr, n, cols, deq, x, rows)
		}
	}
}

// halfX is x (elems floats on the device) rounded by conv (kToF16 or
// kToBF16) into scratch sHalf; products of the same x in a row round it
// once.
func (b *Backend) halfX(x dptr, elems, conv int) dptr {
	xh := b.buf(sHalf, 2*elems)
	b.lastConv = conv
	if h := b.halfOf; h.x != x || h.elems != elems || h.conv != conv {
		b.launch(conv, blocks(elems, elemThreads), 1, elemThreads, 0, xh, x, argI(elems))
		b.halfOf.x, b.halfOf.elems, b.halfOf.conv = x, elems, conv
	}
	return xh
}

// halfShadow is where a norm or SwiGLU of rows rows (elems outputs) also
// writes its output rounded for the product after it, and how
// (bk_half_out's kind), or (0, 0): only when that product will be a
// GemmEx one (more rows than the gemv kernels take), and in the half type
// the last GemmEx product rounded its input to — a model's products round
// to one type, so after its first the guess holds, and halfX rounds anew
// when it does not. The shadow saves the cast kernel before each product
// of a prompt chunk, and the read of the float32 output it makes.
func (b *Backend) halfShadow(rows, elems int) (dptr, int) {
	if b.blas == nil || b.exactGEMM || b.noHalfShadow || rows <= b.gemvMax || b.lastConv == 0 {
		return 0, 0
	}
	kind := 1
	if b.lastConv == kToBF16 {
		kind = 2
	}
	return b.buf(sHalf, 2*elems), kind
}

// shadowed notes, after the launch that wrote it, that sHalf holds out
// rounded (halfShadow's kind), for halfX to use.
func (b *Backend) shadowed(out dptr, elems, kind int) {
	if kind == 0 {
		return
	}
	conv := kToF16
	if kind == 2 {
		conv = kToBF16
	}
	b.halfOf.x, b.halfOf.elems, b.halfOf.conv = out, elems, conv
}

// gemmEx: C[n][ldc] (row-major, first m columns) = x[n][k] · A[m][k]ᵀ,
// A and x halves of type typ (a cudaDataType), C float32, float32
// accumulation.
func (b *Backend) gemmEx(c dptr, m, n, k int, a, x dptr, typ, ldc int) {
	b.gemm(blasCall{ex: true, typ: typ, m: m, n: n, k: k, a: a, lda: k, x: x, ldx: k, c: c, ldc: ldc, alpha: 1})
}

// dequantThreads is how many threads bk_dequant_rows wants for n
// elements of dtype dt: one per element, or per 8-element slot of a block
// format.
func dequantThreads(dt kernels.DType, n int) int {
	if dt.Quantized() {
		return n / 8
	}
	return n
}

// sgemm: C[n][ldc] (row-major, first m columns) = x[n][k] · A[m][k]ᵀ,
// i.e. column-major C(m×n) = Aᵀ·x with A stored k×m.
func (b *Backend) sgemm(c dptr, m, n, k int, a, x dptr, ldc int) {
	b.gemm(blasCall{m: m, n: n, k: k, a: a, lda: k, x: x, ldx: k, c: c, ldc: ldc, alpha: 1})
}

// blasCall is one cuBLAS product, column-major C(m×n) = alpha·Aᵀ·x +
// beta·C, described by value: everything the call passes, so that two
// recorded calls are the same call only when they compute the same thing
// from the same memory (a graph replays the arguments it captured).
type blasCall struct {
	ex            bool // cublasGemmEx, A and x of cudaDataType typ; else cublasSgemm
	typ           int
	m, n, k       int
	a, x, c       dptr
	lda, ldx, ldc int
	alpha, beta   float32
}

// gemm queues c, or records it into the graph step being recorded.
func (b *Backend) gemm(c blasCall) {
	if r := b.g.rec; r != nil {
		if b.blasWork == 0 {
			r.why = "a cuBLAS product without a workspace of ours (" + b.blasNoCapture + ")"
		}
		r.ops = append(r.ops, stepOp{kind: opBLAS, blas: c})
		r.products = true
		return
	}
	if err := b.blasNow(&c); err != nil {
		panic(err)
	}
}

// blasNow issues c on the handle's stream, b.stream: queued, or captured
// while that stream captures.
func (b *Backend) blasNow(c *blasCall) error {
	h := C.uintptr_t(b.blasH)
	if c.ex {
		return blasCheck("cublasGemmEx", C.bk_gemmex_tn(b.blas, h, C.int(c.m), C.int(c.n), C.int(c.k), C.float(c.alpha),
			C.bk_dptr(c.a), C.int(c.typ), C.int(c.lda), C.bk_dptr(c.x), C.int(c.ldx), C.float(c.beta), C.bk_dptr(c.c), C.int(c.ldc)))
	}
	return blasCheck("cublasSgemm", C.bk_sgemm_tn(b.blas, h, C.int(c.m), C.int(c.n), C.int(c.k), C.float(c.alpha),
		C.bk_dptr(c.a), C.int(c.lda), C.bk_dptr(c.x), C.int(c.ldx), C.float(c.beta), C.bk_dptr(c.c), C.int(c.ldc)))
}

// RMSNorm implements kernels.Backend.
func (b *Backend) RMSNorm(out, x, weight []float32, n int, eps float32) {
	d := len(weight)
	if n <= 0 || d == 0 {
		return
	}
	kernels.CheckRMSNorm(out, x, n, d)
	b.lock()
	defer b.unlock()
	dx := b.in(sX, x[:n*d])
	dw := b.in(sVec, weight)
	do, done := b.out(sOut, out, n*d)
	half, kind := b.halfShadow(n, n*d)
	b.launch(kRMSNorm, n, 1, min(256, roundUp(d, 32)), 0, do, dx, dw, argI(n), argI(d), argF(eps), half, argI(kind))
	b.shadowed(do, n*d, kind)
	b.wrote(done)
}

// AddRMSNorm implements kernels.AddRMSNormer: one kernel adds the
// residual into x and normalises it.
func (b *Backend) AddRMSNorm(out, x, delta, weight []float32, n int, eps float32) {
	d := len(weight)
	if n <= 0 || d == 0 {
		return
	}
	kernels.CheckRMSNorm(out, x, n, d)
	kernels.CheckElementwise("AddRMSNorm", n*d, delta)
	b.lock()
	defer b.unlock()
	dx, xDone := b.inOut(sX, x[:n*d])
	dd := b.in(sX2, delta[:n*d])
	dw := b.in(sVec, weight)
	do, done := b.out(sOut, out, n*d)
	half, kind := b.halfShadow(n, n*d)
	b.launch(kAddRMSNorm, n, 1, min(256, roundUp(d, 32)), 0, do, dx, dd, dw, argI(n), argI(d), argF(eps), half,
		argI(kind))
	b.shadowed(do, n*d, kind)
	b.wrote(xDone)
	b.wrote(done)
}

// ropeArgs are the rotation's arguments shared by ApplyRoPE and
// RoPEStoreKV: the half dimension, NeoX flag, position scale and the
// frequencies on the device.
func (b *Backend) ropeArgs(r kernels.RoPE) (half, neox int, scale float64, freq dptr) {
	if r.NeoX {
		neox = 1
	}
	return r.Dim / 2, neox, r.PositionScale(), uploadSame(b, sFreq, b.frequencies(r))
}

// ropeFreqs are the frequencies of the last rotation asked for: a forward
// pass asks every layer for the same ones, and math.Pow over a head's
// pairs each time showed in a served profile.
type ropeFreqs struct {
	dim     int
	theta   float32
	factors []float32
	freq    []float64
}

// frequencies is r.Frequencies(), computed again only when r's change.
func (b *Backend) frequencies(r kernels.RoPE) []float64 {
	c := &b.rope
	if c.freq == nil || c.dim != r.Dim || c.theta != r.Theta || !slices.Equal(c.factors, r.Factors) {
		*c = ropeFreqs{dim: r.Dim, theta: r.Theta, factors: slices.Clone(r.Factors), freq: r.Frequencies()}
	}
	return c.freq
}

// ApplyRoPE implements kernels.Backend.
func (b *Backend) ApplyRoPE(x []float32, positions []int32, heads, headDim int, r kernels.RoPE) {
	if len(positions) == 0 || r.Dim/2 <= 0 || heads <= 0 {
		return
	}
	kernels.CheckRoPE(x, len(positions), heads, headDim, r)
	n := len(positions) * heads * headDim
	b.lock()
	defer b.unlock()
	dx, done := b.inOut(sX, x[:n])
	dp := uploadSame(b, sPositions, positions)
	half, neox, scale, df := b.ropeArgs(r)
	b.launch(kRoPE, blocks(len(positions)*half*heads, elemThreads), 1, elemThreads, 0, dx, dp, argI(len(positions)),
		argI(heads), argI(headDim), argI(half), argI(neox), argD(scale), df)
	b.wrote(done)
}

// RoPEStoreKV implements kernels.RoPEStorer: one kernel rotates q and k
// and stores k and v into the pool (kv must be this backend's GPU pool).
func (b *Backend) RoPEStoreKV(q, k, v []float32, positions []int32, heads int, r kernels.RoPE, kv kernels.PagedKV, layer int,
	slots []int32) {
	if len(slots) == 0 {
		return
	}
	hd := kv.HeadDim
	kernels.CheckRoPE(q, len(positions), heads, hd, r)
	kernels.CheckRoPE(k, len(positions), kv.KVHeads, hd, r)
	kernels.CheckStoreKV(kv, layer, slots, k, v)
	if len(positions) != len(slots) {
		panic(fmt.Sprintf("cuda: RoPEStoreKV of %d positions and %d slots", len(positions), len(slots)))
	}
	ntok, rf := len(slots), kv.RowFloats()
	b.lock()
	defer b.unlock()
	pool := b.devKV(kv)
	dq, qDone := b.inOut(sX, q[:ntok*heads*hd])
	dk, kDone := b.inOut(sX2, k[:ntok*rf])
	dv := b.in(sOut, v[:ntok*rf])
	dp := uploadSame(b, sPositions, positions)
	ds := uploadSame(b, sSlots, slots)
	half, neox, scale, df := b.ropeArgs(r)
	b.launch(kRoPEStoreKV, blocks(ntok*(half*(heads+kv.KVHeads)+rf), elemThreads), 1, elemThreads, 0, dq, dk, dv, dp,
		argI(ntok), argI(heads), argI(kv.KVHeads), argI(hd), argI(half), argI(neox), argD(scale), df, pool, ds,
		argI(layer), argI(kv.PageSize), argI(kv.PageElems()), argI(int(kv.DType)))
	b.noteStores(kv, slots)
	b.wrote(qDone)
	b.wrote(kDone)
}

// SwiGLU implements kernels.Backend.
func (b *Backend) SwiGLU(out, gate, up []float32) {
	n := len(gate)
	if n == 0 {
		return
	}
	kernels.CheckElementwise("SwiGLU", n, up, out)
	b.lock()
	defer b.unlock()
	dg := b.in(sX, gate)
	du := b.in(sX2, up[:n])
	do, done := b.out(sOut, out, n)
	half, kind := b.halfShadow(b.lastRows, n) // the rows of up, the product before
	b.launch(kSwiGLU, blocks(n, elemThreads), 1, elemThreads, 0, do, dg, du, argI(n), half, argI(kind))
	b.shadowed(do, n, kind)
	b.wrote(done)
}

// Add implements kernels.Backend.
func (b *Backend) Add(out, a, bb []float32) {
	n := len(out)
	if n == 0 {
		return
	}
	kernels.CheckElementwise("Add", n, a, bb)
	b.lock()
	defer b.unlock()
	da := b.in(sX, a[:n])
	db := b.in(sX2, bb[:n])
	do, done := b.out(sOut, out, n)
	b.launch(kAdd, blocks(n, elemThreads), 1, elemThreads, 0, do, da, db, argI(n))
	b.wrote(done)
}

// GatherRows implements kernels.RowGatherer.
func (b *Backend) GatherRows(dst, src []float32, width int, rows []int32) {
	if len(rows) == 0 || width <= 0 {
		return
	}
	n := len(src) / width
	for _, r := range rows {
		if r < 0 || int(r) >= n {
			panic(fmt.Sprintf("cuda: GatherRows row %d of %d", r, n))
		}
	}
	kernels.CheckElementwise("GatherRows", len(rows)*width, dst)
	b.lock()
	defer b.unlock()
	ds := b.in(sX, src)
	dr := upload(b, sIdx1, rows)
	do, done := b.out(sOut, dst, len(rows)*width)
	b.launch(kGatherRows, blocks(len(rows)*width, elemThreads), 1, elemThreads, 0, do, ds, dr, argI(len(rows)), argI(width))
	b.wrote(done)
}

// Embed implements kernels.Backend.
func (b *Backend) Embed(out []float32, table *kernels.Matrix, ids []int32) {
	if len(ids) == 0 {
		return
	}
	kernels.CheckEmbed(out, table, ids)
	n := len(ids) * table.Cols
	b.lock()
	defer b.unlock()
	m := b.weight(table)
	di := upload(b, sIdx1, ids)
	do, done := b.out(sOut, out, n)
	b.launch(kDequantRows, blocks(dequantThreads(m.dtype, n), elemThreads), 1, elemThreads, 0, do, m.ptr,
		argI(int(m.dtype)), argI(m.cols), di, 0, argI(len(ids)))
	b.wrote(done)
}

// StoreKV implements kernels.Backend: kv must be this backend's GPU pool.
func (b *Backend) StoreKV(kv kernels.PagedKV, layer int, slots []int32, k, v []float32) {
	if len(slots) == 0 {
		return
	}
	kernels.CheckStoreKV(kv, layer, slots, k, v)
	rf := kv.RowFloats()
	n := len(slots) * rf
	b.lock()
	defer b.unlock()
	pool := b.devKV(kv)
	ds := uploadSame(b, sSlots, slots)
	dk := b.in(sX, k[:n])
	dv := b.in(sX2, v[:n])
	b.launch(kStoreKV, blocks(n, elemThreads), 1, elemThreads, 0, pool, ds, dk, dv, argI(len(slots)), argI(layer),
		argI(kv.PageSize), argI(kv.PageElems()), argI(rf), argI(int(kv.DType)))
	b.noteStores(kv, slots)
}

// noteStores records a queued store into the pages of slots. The copies
// from pageable memory are staged before they return and the kernel is
// ordered before any later call on the stream: no wait here. The pages
// remember this store, so that a page read waits for it.
func (b *Backend) noteStores(kv kernels.PagedKV, slots []int32) {
	kp, seq := kv.Device.(*KVPool), b.stores.Add(1)
	for _, s := range slots {
		kp.stored[int(s)/kv.PageSize].Store(seq)
	}
}

// attnPlan is an Attention call cut into kernel work.
type attnPlan struct {
	pages      []int32
	seqs       []int64
	items      []int32 // attention.cuh's work
	tiles      []int32 // attn_mma.cuh's work: (sequence, first row) per mmaRows rows
	rows       int     // query rows of all sequences with QLen > 0
	contiguous bool    // those rows are q[0:rows] in order
	spans      [][2]int
	maxLen     int // the longest KVLen of the items' sequences
	layer      int
	members    int // the most (row, head) members of one item
}

// mmaAttention reports whether the tensor-core kernel serves a pool:
// f16, bf16 or fp8 KV, head dim 64, 128 or 256. Its sequences of at least
// mmaMinQLen rows go there.
func mmaAttention(kv kernels.PagedKV) bool {
	hd := kv.HeadDim
	return kv.DType != kernels.F32 && (hd == 64 || hd == 128 || hd == 256)
}

// plan cuts a call into work, in pl's slices: with mma, the sequences the
// tensor-core kernel takes (mmaAttention) become tiles, the rest items.
// Both read the same sequence and page tables and write rows of one
// output.
func (pl *attnPlan) plan(kv kernels.PagedKV, layer int, seqs []kernels.AttnSeq, heads, qlen, outlen int, mma bool) {
	kernels.CheckAttention(outlen, qlen, kv, layer, seqs, heads)
	hd := kv.HeadDim
	if hd > attnMaxHD {
		panic(fmt.Sprintf("cuda: Attention head dim %d > %d is not supported", hd, attnMaxHD))
	}
	group := heads / kv.KVHeads
	nh := min(group, attnMaxMembers)
	rowsPer := max(1, attnMaxMembers/nh)
	*pl = attnPlan{pages: pl.pages[:0], seqs: pl.seqs[:0], items: pl.items[:0], tiles: pl.tiles[:0], spans: pl.spans[:0],
		contiguous: true, layer: layer}
	mma = mma && mmaAttention(kv)
	toMMA := func(s kernels.AttnSeq) bool { return mma && s.QLen >= mmaMinQLen }
	for _, s := range seqs {
		if !toMMA(s) {
			pl.members = max(pl.members, nh*min(rowsPer, s.QLen))
		}
	}
	for _, s := range seqs {
		if s.QLen <= 0 {
			continue
		}
		used := (s.KVLen + kv.PageSize - 1) / kv.PageSize
		if s.QStart != pl.rows {
			pl.contiguous = false
		}
		idx := int32(len(pl.seqs) / attnSeqFields)
		pl.seqs = append(pl.seqs, int64(len(pl.pages)), int64(pl.rows), int64(s.QLen), int64(s.KVLen))
		pl.pages = append(pl.pages, s.Pages[:used]...)
		pl.spans = append(pl.spans, [2]int{s.QStart, s.QLen})
		pl.rows += s.QLen
		if toMMA(s) {
			for r := 0; r < s.QLen; r += mmaRows {
				pl.tiles = append(pl.tiles, idx, int32(r))
			}
			continue
		}
		for kh := 0; kh < kv.KVHeads; kh++ {
			for h := kh * group; h < (kh+1)*group; h += nh {
				hn := min(nh, (kh+1)*group-h)
				for r := 0; r < s.QLen; r += rowsPer {
					rn := min(rowsPer, s.QLen-r)
					pl.items = append(pl.items, idx, int32(kh), int32(r), int32(rn), int32(h), int32(hn))
				}
			}
		}
		pl.maxLen = max(pl.maxLen, s.KVLen)
	}
}

// splits picks how many parts each item's positions are cut into
// (flash-decoding): enough blocks for attnBlocksPerSM on every SM, with at
// least attnSplitLen positions a part. A batch of many items runs unsplit
// (one kernel, no combine step); one long sequence is cut finely.
func (b *Backend) splits(items, maxLen int) int {
	if b.forceSplits > 0 {
		return b.forceSplits
	}
	target := attnBlocksPerSM * max(1, b.info.sms)
	if items >= target {
		return 1
	}
	return max(1, min((target+items-1)/items, (maxLen+attnSplitLen-1)/attnSplitLen, attnMaxSplits))
}

// Attention implements kernels.Backend: kv must be this backend's GPU pool.
func (b *Backend) Attention(out, q []float32, kv kernels.PagedKV, layer int, seqs []kernels.AttnSeq, heads int, scale float32) {
	if len(seqs) == 0 {
		return
	}
	b.lock()
	defer b.unlock()
	// One plan's slices serve every call (a step plans once a layer).
	pl := &b.attnPlan
	pl.plan(kv, layer, seqs, heads, len(q), len(out), !b.noAttnMMA)
	if len(pl.items) == 0 && len(pl.tiles) == 0 {
		return
	}
	rowSize := heads * kv.HeadDim
	var dq dptr
	if pl.contiguous {
		dq = b.in(sX, q[:pl.rows*rowSize])
	} else {
		b.toHost(q) // rows gathered on the host
		b.hostQ = b.hostQ[:0]
		for _, s := range pl.spans {
			b.hostQ = append(b.hostQ, q[s[0]*rowSize:(s[0]+s[1])*rowSize]...)
		}
		dq = upload(b, sX, b.hostQ)
	}
	a := b.attnUpload(kv, pl, heads, scale)
	if pl.contiguous {
		do, done := b.out(sOut, out, pl.rows*rowSize)
		if a.nitems == 0 { // only the tensor-core kernel writes out
			a.half, a.halfKind = b.halfShadow(pl.rows, pl.rows*rowSize)
		}
		b.attnLaunch(a, dq, do)
		b.shadowed(do, pl.rows*rowSize, a.halfKind)
		b.wrote(done)
		return
	}
	do := b.buf(sOut, 4*pl.rows*rowSize)
	b.attnLaunch(a, dq, do)
	b.toHost(out) // rows scattered on the host
	b.hostWrote(out)
	b.hostQ = b.hostQ[:pl.rows*rowSize]
	download(b, b.hostQ, do)
	r := 0
	for _, s := range pl.spans {
		copy(out[s[0]*rowSize:(s[0]+s[1])*rowSize], b.hostQ[r*rowSize:(r+s[1])*rowSize])
		r += s[1]
	}
}

// attnCall is an Attention call's device side, ready to launch.
type attnCall struct {
	kv                   dptr
	pages, seqs, items   dptr
	tiles                dptr
	part                 dptr
	nitems, nsplit, rows int
	ntiles, group        int
	heads, hd            int
	ps, pe, rf, layer    int
	scale                float32
	kernel               int // by KV dtype and member bound
	mmaKernel            int // by KV dtype and head dim
	lanes                int // lanes that read one K or V row
	vec16                bool
	half                 dptr // the tensor-core kernel's rounded copy of out (halfShadow)
	halfKind             int
}

// attnUpload uploads a plan's tables.
func (b *Backend) attnUpload(kv kernels.PagedKV, pl *attnPlan, heads int, scale float32) attnCall {
	a := attnCall{kv: b.devKV(kv), nitems: len(pl.items) / attnItemFields, rows: pl.rows, heads: heads, hd: kv.HeadDim,
		ps: kv.PageSize, pe: kv.PageElems(), rf: kv.RowFloats(), layer: pl.layer, scale: scale,
		ntiles: len(pl.tiles) / mmaTileFields, group: heads / kv.KVHeads}
	a.pages = uploadSame(b, sPages, pl.pages)
	a.seqs = uploadSame(b, sSeqs, pl.seqs)
	if a.ntiles > 0 {
		a.tiles = uploadSame(b, sTiles, pl.tiles)
		a.mmaKernel = attnMMAKernel(kv.DType, kv.HeadDim)
	}
	if a.nitems == 0 {
		return a
	}
	a.kernel, a.lanes, a.vec16 = attnKernel(kv.DType, kv.HeadDim, pl.members)
	maxLen := pl.maxLen
	if b.g.rec != nil {
		// A graph's grid is fixed: split as for the longest sequence
		// the splits serve, with parts past a sequence's end left empty.
		maxLen = attnMaxSplits * attnSplitLen
	}
	a.nsplit = b.splits(a.nitems, maxLen)
	a.items = uploadSame(b, sItems, pl.items)
	if a.nsplit > 1 {
		a.part = b.buf(sPart, 4*a.nsplit*a.rows*heads*(a.hd+2))
	}
	return a
}

// attnKernel chooses the attention kernel for a KV dtype and the most
// members of an item, and how its lanes read a row: vectors of 16 bytes
// (4 floats or 8 halves) or 8 (8 fp8 elements) a lane, on as many lanes
// (a power of two, at most a warp) as cover the head; vec16 when every
// row is aligned to the vector so a vector is one load.
func attnKernel(dt kernels.DType, hd, members int) (kernel, lanes int, vec16 bool) {
	m4, m8, vec := kAttnF32M4, kAttnF32M8, 4
	switch dt {
	case kernels.F32:
	case kernels.F16:
		m4, m8, vec = kAttnF16M4, kAttnF16M8, 8
	case kernels.BF16:
		m4, m8, vec = kAttnBF16M4, kAttnBF16M8, 8
	case kernels.F8E4M3:
		m4, m8, vec = kAttnE4M3M4, kAttnE4M3M8, 8
	default:
		panic(fmt.Sprintf("cuda: KV dtype %s", dt))
	}
	kernel = m4
	if members > 4 {
		kernel = m8
	}
	lanes = 1
	for lanes < 32 && lanes*vec < hd {
		lanes *= 2
	}
	return kernel, lanes, hd%vec == 0
}

// attnMMAKernel is the tensor-core kernel of a KV dtype and head dim
// (mmaAttention).
func attnMMAKernel(dt kernels.DType, hd int) int {
	i := 0
	switch hd {
	case 128:
		i = 1
	case 256:
		i = 2
	}
	switch dt {
	case kernels.F16:
		return [...]int{kAttnMMAF16HD64, kAttnMMAF16HD128, kAttnMMAF16HD256}[i]
	case kernels.BF16:
		return [...]int{kAttnMMABF16HD64, kAttnMMABF16HD128, kAttnMMABF16HD256}[i]
	case kernels.F8E4M3:
		return [...]int{kAttnMMAE4M3HD64, kAttnMMAE4M3HD128, kAttnMMAE4M3HD256}[i]
	}
	panic(fmt.Sprintf("cuda: no tensor-core attention over %s KV", dt))
}

// mmaSmem is the dynamic shared memory of the tensor-core kernel at a
// head dim: the K tile as stored and the V tile transposed, in halves.
func mmaSmem(hd int) int {
	pos := mmaPos
	if hd == 256 {
		pos = mmaPosHD256
	}
	return 2 * (pos*(hd+mmaPad) + hd*(pos+mmaPad))
}

// attnLaunch runs the attention kernels: out (device, rows of heads*hd)
// from q (likewise). The tensor-core kernel runs last: the combine step
// writes every row (those of its sequences from unused parts), and it
// then writes its own.
func (b *Backend) attnLaunch(a attnCall, q, out dptr) {
	if a.nitems > 0 {
		b.attnLaunchItems(a, q, out)
	}
	if a.ntiles > 0 {
		b.launch(a.mmaKernel, a.ntiles, a.heads, mmaThreads, mmaSmem(a.hd), out, q, a.kv, a.pages, a.seqs, a.tiles,
			argI(a.heads), argI(a.group), argI(a.ps), argI(a.pe), argI(a.rf), argI(a.layer), argF(a.scale), a.half,
			argI(a.halfKind))
	}
}

// attnLaunchItems runs attention.cuh's kernel on the items, and the
// combine step when they are split.
func (b *Backend) attnLaunchItems(a attnCall, q, out dptr) {
	smem := 4 * (attnWarps*attnMaxMembers*(a.hd+2) + attnMaxMembers*a.hd)
	vec16 := 0
	if a.vec16 {
		vec16 = 1
	}
	b.launch(a.kernel, a.nitems, a.nsplit, attnThreads, smem, out, a.part, q, a.kv, a.pages, a.seqs, a.items,
		argI(a.rows), argI(a.heads), argI(a.hd), argI(a.ps), argI(a.pe), argI(a.rf), argI(a.layer), argF(a.scale),
		argI(a.lanes), argI(vec16))
	if a.nsplit > 1 {
		b.launch(kAttnCombine, a.rows*a.heads, 1, min(128, roundUp(a.hd, 32)), 0, out, a.part, argI(a.rows*a.heads),
			argI(a.hd), argI(a.nsplit))
	}
}
