// Package kernels is the one place that touches numbers in bulk. The model
// is written once against Backend; cpu and (later) cuda implement it, and
// ref is the plain-Go definition every implementation is tested against.
package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// DType is the storage type of a weight matrix.
type DType int

// Weight storage types.
const (
	F32 DType = iota
	F16
	Q8_0 // blocks of 32: an f16 scale then 32 int8
	BF16
	// ggml's quantised formats, block layouts in quant.go.
	Q4_0
	Q4_1
	Q5_0
	Q5_1
	Q4_K
	Q5_K
	Q6_K
	Q3_K
	Q2_K
	// F8E4M3 is fp8 e4m3 (fp8.go): a KV dtype only, never a weight's.
	F8E4M3
)

func (d DType) String() string {
	if int(d) >= 0 && int(d) < len(dtypeInfo) {
		return dtypeInfo[d].name
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// RowBytes is the storage size of one row of n elements (n a multiple of
// BlockSize).
func (d DType) RowBytes(n int) int {
	if int(d) < 0 || int(d) >= len(dtypeInfo) {
		panic("kernels: unknown dtype")
	}
	in := dtypeInfo[d]
	return n / in.block * in.bytes
}

// BlockSize is how many elements share one block of a quantised format (1
// for the float types); a row's length must be a multiple of it.
func (d DType) BlockSize() int { return dtypeInfo[d].block }

// Quantized says whether d is one of the block formats with integer
// quants (Q8_0 and the ggml types after it), as opposed to a float type.
func (d DType) Quantized() bool { return d == Q8_0 || d >= Q4_0 && d <= Q2_K }

// Matrix is a weight matrix of Rows rows, each Cols elements long, stored
// row-major. A GGUF tensor of shape [in, out] is a Matrix with Rows=out and
// Cols=in, so a product out = x·Wᵀ reads whole rows.
type Matrix struct {
	DType      DType
	Rows, Cols int
	Data       []byte
}

// Validate checks that Data is exactly the size the shape needs.
func (m *Matrix) Validate() error {
	if m.Rows <= 0 || m.Cols <= 0 {
		return fmt.Errorf("kernels: bad matrix shape %dx%d", m.Rows, m.Cols)
	}
	if m.DType < 0 || m.DType > Q2_K {
		return fmt.Errorf("kernels: unknown weight dtype %s", m.DType)
	}
	if bs := m.DType.BlockSize(); m.Cols%bs != 0 {
		return fmt.Errorf("kernels: %s matrix with %d columns (not a multiple of %d)", m.DType, m.Cols, bs)
	}
	if want := m.DType.RowBytes(m.Cols) * m.Rows; len(m.Data) != want {
		return fmt.Errorf("kernels: %s matrix %dx%d needs %d bytes, has %d", m.DType, m.Rows, m.Cols, want, len(m.Data))
	}
	return nil
}

// Row dequantises row r into dst (len Cols).
func (m *Matrix) Row(r int, dst []float32) {
	rb := m.DType.RowBytes(m.Cols)
	b := m.Data[r*rb : (r+1)*rb]
	switch m.DType {
	case F32:
		for i := range dst[:m.Cols] {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case F16:
		for i := range dst[:m.Cols] {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case BF16:
		for i := range dst[:m.Cols] {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
	case Q8_0:
		for blk := 0; blk < m.Cols/32; blk++ {
			q := b[blk*34:]
			d := F16ToF32(binary.LittleEndian.Uint16(q))
			for j := 0; j < 32; j++ {
				dst[blk*32+j] = d * float32(int8(q[2+j]))
			}
		}
	default:
		decodeRow(m.DType, b, dst[:m.Cols])
	}
}

// EncodeRow stores float32 values in dtype dt (the inverse of Matrix.Row,
// up to rounding). len(dst) must be dt.RowBytes(len(row)).
func EncodeRow(dst []byte, row []float32, dt DType) {
	switch dt {
	case F32:
		for i, v := range row {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range row {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
	case BF16:
		for i, v := range row {
			binary.LittleEndian.PutUint16(dst[2*i:], uint16(math.Float32bits(v)>>16))
		}
	case Q8_0:
		for b := 0; b < len(row)/32; b++ {
			blk := row[b*32 : b*32+32]
			var amax float32
			for _, v := range blk {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			d := amax / 127
			out := dst[b*34:]
			binary.LittleEndian.PutUint16(out, F32ToF16(d))
			inv := float32(0)
			if d != 0 {
				inv = 1 / d
			}
			for j, v := range blk {
				out[2+j] = byte(int8(math.Round(float64(v * inv))))
			}
		}
	default:
		encodeRow(dt, dst, row)
	}
}

// F16ToF32 converts an IEEE half to float32.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		e := uint32(127 - 15 + 1)
		for man&0x400 == 0 {
			man <<= 1
			e--
		}
		man &= 0x3ff
		return math.Float32frombits(sign | e<<23 | man<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// F32ToF16 converts float32 to IEEE half, rounding to nearest even.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := man >> shift
		rem := man & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++
	}
	return sign | uint16(r)
}

// PagedKV describes KV pool memory. Page p holds, for every layer l, a K
// block then a V block, each [PageSize][KVHeads][HeadDim] elements of
// DType (F32, F16, BF16 or F8E4M3); so one page is one contiguous range (what a
// transfer moves), and a token's K for one layer is one contiguous row of
// KVHeads*HeadDim.
//
// Data is the storage as 4-byte words whatever the dtype: a page of F16 or
// BF16 takes half the words of an F32 one, and its elements are the
// little-endian halves of those words (see Halves); an F8E4M3 page takes a
// quarter, its elements the words' bytes (see Bytes). Keeping one slice type
// lets every owner of pool memory (the pool, UCX registration, tests)
// allocate and address it without caring what it holds.
//
// The memory is either Data, in Go, or Device: memory a backend holds
// itself (a GPU's), which only that backend's kernels address and
// everything else reaches a page at a time. Exactly one of them is set.
type PagedKV struct {
	Data                               []float32
	Device                             DeviceKV
	PageSize, Layers, KVHeads, HeadDim int
	// DType is the element type of the stored K and V: F32 (the zero
	// value), F16, BF16 or F8E4M3. Attention converts on load; StoreKV
	// rounds.
	DType DType
}

// KVNaN is a float32 whose bits are also a quiet NaN read as two F16 or
// two BF16 halves and as four e4m3 bytes (0x7f and 0xff are e4m3's NaNs),
// so filling Data's words with it poisons a pool of any KV dtype.
var KVNaN = math.Float32frombits(0x7fff7fff)

// ValidKVDType says whether d is a dtype KV can be stored in (on some
// backend: see SupportsKVDType).
func ValidKVDType(d DType) bool { return d == F32 || d == F16 || d == BF16 || d == F8E4M3 }

// ElemBytes is the size of one stored K or V element.
func (kv PagedKV) ElemBytes() int {
	switch kv.DType {
	case F32:
		return 4
	case F16, BF16:
		return 2
	case F8E4M3:
		return 1
	}
	panic(fmt.Sprintf("kernels: KV dtype %s", kv.DType))
}

// Halves is Data seen as its 2-byte elements (for an F16 or BF16 pool);
// element i of the pool is Halves()[i], with the offsets of KOffset.
func (kv PagedKV) Halves() []uint16 {
	if len(kv.Data) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&kv.Data[0])), 2*len(kv.Data))
}

// Bytes is Data seen as bytes: an F8E4M3 pool's elements, with the
// offsets of KOffset (and any pool's packed rows, byte for byte, on a
// little-endian host).
func (kv PagedKV) Bytes() []byte {
	if len(kv.Data) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&kv.Data[0])), 4*len(kv.Data))
}

// PackedBytes is the size of the first tokens slots of one page in the
// packed layout DeviceKV and transfers use: for every layer its K rows
// then its V rows, little-endian elements of DType.
func (kv PagedKV) PackedBytes(tokens int) int {
	return kv.Layers * 2 * tokens * kv.RowFloats() * kv.ElemBytes()
}

// DeviceKV is KV pool memory a backend holds outside Go memory. Its
// methods are safe for concurrent use with each other and with the
// backend's kernels, as long as no two of them touch the same page at once
// (the pool's bookkeeping sees to that) and a page is written or filled
// only when no kernel still queued reads it (a forward pass returns with
// its kernels done, and pages change hands between forward passes).
type DeviceKV interface {
	// Pages is the number of pages it holds.
	Pages() int
	// ReadPage copies the first tokens slots of page, packed, into dst
	// (grown as needed), after the kernels queued before it that store
	// into that page.
	ReadPage(page int32, tokens int, dst []byte) ([]byte, error)
	// WritePage writes packed rows into the first tokens slots of page;
	// they are in place, for every kernel queued later, when it returns.
	WritePage(page int32, tokens int, src []byte) error
	// Fill sets every float of the given pages (all of them for nil) to v.
	Fill(pages []int32, v float32) error
	// Close frees the memory.
	Close() error
}

// PagesReader is a DeviceKV that packs several pages in one pass: their
// copies to the host share one wait, where ReadPage waits once a page.
// Each returned slice is ReadPage's result for the page at that index.
type PagesReader interface {
	ReadPages(pages []int32, tokens []int) ([][]byte, error)
}

// KVAllocator is a backend that holds the KV pool in its own memory:
// PagedKV values it reads and writes must have Device set to memory from
// its AllocKV. The memory starts zeroed.
type KVAllocator interface {
	AllocKV(layout PagedKV, pages int) (DeviceKV, error)
}

// CheckHostKV panics unless kv's memory is in Go (Data): for code that
// reads or writes the pool directly; who names it in the message.
func CheckHostKV(who string, kv PagedKV) {
	if kv.Device != nil || kv.Data == nil {
		panic(fmt.Sprintf("kernels: %s needs the KV pool in host memory (PagedKV.Data)", who))
	}
}

// RowFloats is KVHeads*HeadDim: one token's K (or V) for one layer.
func (kv PagedKV) RowFloats() int { return kv.KVHeads * kv.HeadDim }

// PageElems is the number of K and V elements of one page.
func (kv PagedKV) PageElems() int { return kv.Layers * 2 * kv.PageSize * kv.RowFloats() }

// PageFloats is the size of one page in Data's 4-byte words: PageElems
// for F32, half that for F16 and BF16, a quarter for F8E4M3 (whose pages
// hold a multiple of 4 elements: an even head dim makes them so).
func (kv PagedKV) PageFloats() int { return kv.PageElems() * kv.ElemBytes() / 4 }

// KOffset is the element index of the K row of (page, layer,
// slot-in-page): into Data for F32, into Halves for F16 and BF16, into
// Bytes for F8E4M3.
func (kv PagedKV) KOffset(page, layer, slot int) int {
	return page*kv.PageElems() + (layer*2*kv.PageSize+slot)*kv.RowFloats()
}

// VOffset is the element index of the V row of (page, layer,
// slot-in-page), like KOffset.
func (kv PagedKV) VOffset(page, layer, slot int) int {
	return page*kv.PageElems() + ((layer*2+1)*kv.PageSize+slot)*kv.RowFloats()
}

// StoreRow writes row (RowFloats values) at element offset off, rounded
// to the pool's dtype.
func (kv PagedKV) StoreRow(off int, row []float32) {
	switch kv.DType {
	case F32:
		copy(kv.Data[off:off+len(row)], row)
	case F16:
		h := kv.Halves()[off : off+len(row)]
		for i, v := range row {
			h[i] = F32ToF16(v)
		}
	case BF16:
		h := kv.Halves()[off : off+len(row)]
		for i, v := range row {
			h[i] = F32ToBF16(v)
		}
	case F8E4M3:
		e := kv.Bytes()[off : off+len(row)]
		for i, v := range row {
			e[i] = F32ToE4M3(v)
		}
	default:
		panic(fmt.Sprintf("kernels: KV dtype %s", kv.DType))
	}
}

// LoadRow reads len(dst) elements at element offset off as float32.
func (kv PagedKV) LoadRow(off int, dst []float32) {
	switch kv.DType {
	case F32:
		copy(dst, kv.Data[off:off+len(dst)])
	case F16:
		for i, h := range kv.Halves()[off : off+len(dst)] {
			dst[i] = F16ToF32(h)
		}
	case BF16:
		for i, h := range kv.Halves()[off : off+len(dst)] {
			dst[i] = math.Float32frombits(uint32(h) << 16)
		}
	case F8E4M3:
		for i, e := range kv.Bytes()[off : off+len(dst)] {
			dst[i] = E4M3ToF32(e)
		}
	default:
		panic(fmt.Sprintf("kernels: KV dtype %s", kv.DType))
	}
}

// F32ToBF16 converts float32 to bfloat16, rounding to nearest even (a NaN
// stays a NaN).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// AttnSeq is one sequence of an attention call. Its query rows are
// q[QStart : QStart+QLen] (rows of Heads*HeadDim); they sit at positions
// KVLen-QLen .. KVLen-1, and row i attends causally to positions
// 0 .. KVLen-QLen+i, read through Pages (position p lives in page
// Pages[p/PageSize], slot p%PageSize). A decode step is QLen 1; a prefill
// chunk is QLen = chunk length, with earlier chunks already in the pages.
type AttnSeq struct {
	Pages        []int32
	QStart, QLen int
	KVLen        int
}

// RoPE describes rotary position embedding.
type RoPE struct {
	Dim   int     // rotated dimensions per head (<= HeadDim), even
	Theta float32 // base
	NeoX  bool    // pairs (i, i+Dim/2) instead of adjacent (2i, 2i+1)
	// PosScale multiplies positions (linear scaling: 1/factor); 0 means 1.
	PosScale float32
	// Factors, when set (len Dim/2), divides each pair's frequency (llama3-style).
	Factors []float32
}

// Frequencies are the rotation frequency of each of the Dim/2 pairs:
// Theta^(-2i/Dim), divided by Factors[i] when set. Every backend uses this
// one definition, in float64, so they rotate by the same angles.
func (r RoPE) Frequencies() []float64 {
	freq := make([]float64, r.Dim/2)
	for i := range freq {
		freq[i] = math.Pow(float64(r.Theta), -2*float64(i)/float64(r.Dim))
		if r.Factors != nil {
			freq[i] /= float64(r.Factors[i])
		}
	}
	return freq
}

// PositionScale is PosScale with its zero value meaning 1.
func (r RoPE) PositionScale() float64 {
	if r.PosScale == 0 {
		return 1
	}
	return float64(r.PosScale)
}

// Backend runs the bulk operations of a forward pass. Activations are
// row-major float32 slices; n is the number of rows (tokens).
type Backend interface {
	Name() string
	// MatMul: out[n, w.Rows] = x[n, w.Cols] · wᵀ.
	MatMul(out, x []float32, n int, w *Matrix)
	// RMSNorm normalises each row of length len(weight): out = x/rms(x)*weight.
	RMSNorm(out, x, weight []float32, n int, eps float32)
	// ApplyRoPE rotates x in place: len(positions) rows of heads*headDim.
	ApplyRoPE(x []float32, positions []int32, heads, headDim int, r RoPE)
	// SwiGLU: out[i] = silu(gate[i]) * up[i].
	SwiGLU(out, gate, up []float32)
	// Add: out[i] = a[i] + b[i].
	Add(out, a, b []float32)
	// Embed copies (dequantised) rows ids of table into out.
	Embed(out []float32, table *Matrix, ids []int32)
	// StoreKV writes rows of k and v (RowFloats each) into the pool at
	// slots (slot = page*PageSize + offset) of the given layer.
	StoreKV(kv PagedKV, layer int, slots []int32, k, v []float32)
	// Attention computes softmax(q·kᵀ·scale)·v per sequence and head, with
	// grouped-query heads (query head h reads KV head h/(heads/KVHeads)).
	// out has the shape of q.
	Attention(out, q []float32, kv PagedKV, layer int, seqs []AttnSeq, heads int, scale float32)
}

// AddRMSNormer is a backend that adds a residual and normalises the sum in
// one pass over the rows: x += delta, then out = x/rms(x)*weight. Between
// layers a forward pass does exactly that, and on a GPU two launches that
// each read the rows cost twice one that reads them once.
type AddRMSNormer interface {
	AddRMSNorm(out, x, delta, weight []float32, n int, eps float32)
}

// AddRMSNorm is x += delta then RMSNorm(out, x): in one call on an
// AddRMSNormer, else as Add then RMSNorm. Either way the same numbers.
func AddRMSNorm(be Backend, out, x, delta, weight []float32, n int, eps float32) {
	if a, ok := be.(AddRMSNormer); ok {
		a.AddRMSNorm(out, x, delta, weight, n, eps)
		return
	}
	d := len(weight)
	be.Add(x[:n*d], x[:n*d], delta[:n*d])
	be.RMSNorm(out, x, weight, n, eps)
}

// RoPEStorer is a backend that rotates a step's q and k and stores k and v
// into the pool in one pass: the rows ApplyRoPE writes are the rows StoreKV
// reads, so on a GPU one launch does the work of three.
type RoPEStorer interface {
	RoPEStoreKV(q, k, v []float32, positions []int32, heads int, r RoPE, kv PagedKV, layer int, slots []int32)
}

// RoPEStoreKV is ApplyRoPE on q (heads heads) and on k (kv.KVHeads heads),
// then StoreKV of k and v at slots: in one call on a RoPEStorer, else as
// those three. Either way the same numbers.
func RoPEStoreKV(be Backend, q, k, v []float32, positions []int32, heads int, r RoPE, kv PagedKV, layer int, slots []int32) {
	if rs, ok := be.(RoPEStorer); ok {
		rs.RoPEStoreKV(q, k, v, positions, heads, r, kv, layer, slots)
		return
	}
	be.ApplyRoPE(q, positions, heads, kv.HeadDim, r)
	be.ApplyRoPE(k, positions, kv.KVHeads, kv.HeadDim, r)
	be.StoreKV(kv, layer, slots, k, v)
}

// RowGatherer is a backend that copies rows between buffers in its own
// memory: dst's row i is src's row rows[i], each width long. A forward
// pass takes its logit rows out of the step's rows this way, so they need
// not visit the host.
type RowGatherer interface {
	GatherRows(dst, src []float32, width int, rows []int32)
}

// GatherRows is dst[i] = src[rows[i]] for rows of width: on the backend
// when it is a RowGatherer, else on the host (bringing kept buffers up to
// date either side).
func GatherRows(be Backend, dst, src []float32, width int, rows []int32) {
	if g, ok := be.(RowGatherer); ok {
		g.GatherRows(dst, src, width, rows)
		return
	}
	Host(be, src, dst)
	for i, r := range rows {
		copy(dst[i*width:(i+1)*width], src[int(r)*width:(int(r)+1)*width])
	}
	Changed(be, dst)
}

// KVDTyper is a backend with its own KV dtype for --kv-cache-dtype auto:
// the dtype its kernels compute in (the cuda backend's f32).
type KVDTyper interface {
	AutoKVDType() DType
}

// AutoKVDType is the KV dtype --kv-cache-dtype auto stores on be: the
// backend's own (KVDTyper), else f16, as llama.cpp stores KV on a CPU:
// half the memory and the handoff bytes of f32, and attention reads it
// directly.
func AutoKVDType(be Backend) DType {
	if k, ok := be.(KVDTyper); ok {
		return k.AutoKVDType()
	}
	return F16
}

// KVDTypeSupporter is a backend whose kernels store and read KV in a set
// of dtypes of its own; one that is not serves F32, F16 and BF16.
type KVDTypeSupporter interface {
	SupportsKVDType(DType) bool
}

// SupportsKVDType says whether be's kernels store and read KV of dtype d,
// so a worker refuses at start-up a --kv-cache-dtype its backend would
// fail on mid-request.
func SupportsKVDType(be Backend, d DType) bool {
	if s, ok := be.(KVDTypeSupporter); ok {
		return s.SupportsKVDType(d)
	}
	return d == F32 || d == F16 || d == BF16
}

// Paralleler is a backend whose threads host code may borrow between its
// operations: Parallel calls fn on ranges covering [0, n), some of them on
// the backend's other threads, and returns when every range has run (a
// panic in any range is raised again on the caller).
type Paralleler interface {
	Parallel(n int, fn func(lo, hi int))
}

// Parallel runs fn over [0, n) on be's threads where it lends them, else as
// one range on the caller.
func Parallel(be Backend, n int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if p, ok := be.(Paralleler); ok {
		p.Parallel(n, fn)
		return
	}
	fn(0, n)
}

// Expert is one expert of a mixture of experts: a SwiGLU FFN,
// Down·(silu(Gate·x) * Up·x). Every expert of a layer has the same shapes.
type Expert struct {
	Gate, Up, Down *Matrix
}

// ExpertRunner is a backend that runs a mixture-of-experts FFN whole, so
// that the rows of a step reach the experts without leaving its memory: a
// backend that keeps activations on a device (Resident) would otherwise
// copy them to the host every layer to gather each expert's rows there.
// The routing (pick, weight) is the caller's, computed on the host: it is
// n*k numbers, and one definition of it serves every backend.
//
// Experts sets out[i] (n rows of Down.Rows) to Σ_j weight[i*k+j] ·
// experts[pick[i*k+j]](x[i]) for j = 0..k-1, summed in that order; x has n
// rows of Gate.Cols. Each expert chosen by any row runs once, over the
// rows that chose it, and reads its weights where the backend keeps them
// (uploaded once, never per call). The result may differ from running
// the same products one by one on the same backend only by the order of
// the k-term sum.
type ExpertRunner interface {
	Experts(out, x []float32, n int, experts []Expert, pick []int32, weight []float32, k int)
}

// DTypeSupporter is a backend that multiplies only some weight dtypes;
// one that does not implement it takes them all.
type DTypeSupporter interface {
	SupportsDType(DType) bool
}

// Resident is a backend that can keep activation buffers in memory of its
// own (a GPU's) between calls, so that a forward pass copies in only its
// inputs and copies out only what the host reads. A buffer is kept with
// Keep (the whole capacity of the slice): from then on a result written to
// it stays in the backend's memory and the host slice is stale until Host
// brings it up to date, and whoever writes the host slice says so with
// Changed. A slice that starts inside a kept buffer but not at its start
// is refused (panics): it would read stale host memory. Buffers not kept
// behave as with any backend. Weight vectors (norms, biases) may be kept
// too: they are uploaded once.
//
// Keep takes Go memory only. A kept buffer's device copy is freed when its
// slice is garbage collected, or at once by Forget (for a buffer its owner
// replaces).
type Resident interface {
	Keep(bufs ...[]float32)
	Forget(bufs ...[]float32)
	Host(bufs ...[]float32)
	Changed(bufs ...[]float32)
}

// Keep calls be.Keep when be is Resident.
func Keep(be Backend, bufs ...[]float32) {
	if r, ok := be.(Resident); ok {
		r.Keep(bufs...)
	}
}

// Forget calls be.Forget when be is Resident.
func Forget(be Backend, bufs ...[]float32) {
	if r, ok := be.(Resident); ok {
		r.Forget(bufs...)
	}
}

// Host calls be.Host when be is Resident: call it before reading a kept
// buffer on the host.
func Host(be Backend, bufs ...[]float32) {
	if r, ok := be.(Resident); ok {
		r.Host(bufs...)
	}
}

// Changed calls be.Changed when be is Resident: call it after writing a
// kept buffer on the host.
func Changed(be Backend, bufs ...[]float32) {
	if r, ok := be.(Resident); ok {
		r.Changed(bufs...)
	}
}

// RowSampler is a backend that picks the next token where the logits are,
// so that a step's logits (rows × vocab, 19 MB at a 152K vocabulary and 32
// rows) need not come to the host: only each row's choice does. logits is
// a kept buffer (Resident) of whole rows of vocab; its host copy may be
// stale. SampleRows fills out[i] for rows[i] (len(out) == len(rows)); a
// row may be sampled more than once.
//
// The semantics are the model's sampler's (internal/model: SampleAfter);
// the model turns a request's parameters and history into SampleRow, so
// this package knows nothing of penalties' rules, only of edits to the
// row. A greedy row's choice is the CPU's argmax exactly; a drawn row's is
// distributed as the CPU's draw, from the same uniform U.
type RowSampler interface {
	SampleRows(logits []float32, vocab int, rows []SampleRow, out []SampleResult)
}

// MaxTopLogprobs bounds SampleRow.TopLogprobs (OpenAI's limit).
const MaxTopLogprobs = 20

// SampleRow is one choice of a RowSampler. The row the choice is made
// from is the raw row with, in order: the edits, the allow mask and the
// bans applied; the logprobs reported are the raw row's.
type SampleRow struct {
	Row int // which row of the logits
	// Edits change single logits before the choice: each id at most once.
	Edits []LogitEdit
	// Repetition divides a positive edited logit whose edit has Repeat,
	// and multiplies a negative one.
	Repetition float32
	// Allow, when set, is a bitset of the tokens that may be chosen (bit
	// id%64 of word id/64); Ban lists tokens that may not.
	Allow []uint64
	Ban   []int32
	// Draw: a draw at Temperature over the candidates left by TopK (0:
	// off), MinP (0: off) and TopP (0 or 1: off), taken with U, uniform in
	// [0, 1). Otherwise the choice is the argmax (the lowest id of ties).
	Draw                    bool
	Temperature, TopP, MinP float64
	TopK                    int
	U                       float64
	TopLogprobs             int // alternatives to report, <= MaxTopLogprobs
}

// LogitEdit is the change a request makes to one token's logit v:
// v += Bias, then (if Repeat) the repetition penalty, then v -= Penalty.
type LogitEdit struct {
	ID      int32
	Bias    float32
	Penalty float32
	Repeat  bool
}

// SampleResult is a RowSampler's answer for one row.
type SampleResult struct {
	ID      int32
	Logprob float32 // of ID under the raw row's distribution
	// Top are the TopLogprobs most likely tokens of the raw row, most
	// likely first (ties: lower id first).
	Top []TokenLogprob
	// NaN: the raw row holds a NaN; nothing else is set.
	NaN bool
}

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}
