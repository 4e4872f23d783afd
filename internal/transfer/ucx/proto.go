package ucx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// The control protocol, one TCP connection per session. Every message is
// an 8-byte header, little endian:
//
//	0     magic 0xBC
//	1     version 4
//	2     type
//	3     flags, must be 0
//	4..8  payload length (uint32)
//
// then the payload. Per type:
//
//	HELLO    sender to receiver, first: room u64, epoch u64, pid u32, host id (bytes),
//	         capability (bytes, 32)
//	WELCOME  receiver to sender: worker address (bytes), rkey (bytes), base u64,
//	         length u64, page size u32, layers u32, KV heads u32, head dim u32,
//	         KV dtype u32 (kernels.DType: f32, f16 or bf16), page checksum u32
//	         (sumXXH3 or sumPageSum), host id (bytes), page count u32, then
//	         that many page ids (i32)
//	REFUSE   receiver to sender: the reason (text); the session has no key
//	END      sender to receiver: every put of the session is remotely complete and
//	         its endpoint closed; the receiver calls Sink.Closed and closes
//	CLOSING  receiver to sender: the receiver is shutting down; end the session
//
// (bytes) is a u32 length then the bytes. Sizes are bounded (maxPayload,
// maxField) so that a broken or hostile peer cannot make either side
// allocate without bound.
const (
	ctlHdr     = 8
	ctlMagic   = 0xBC
	ctlVersion = 4

	msgHello   = 1
	msgWelcome = 2
	msgRefuse  = 3
	msgEnd     = 4
	msgClosing = 5

	maxPayload = 16 << 20
	maxField   = 64 << 10
	maxText    = 4096
)

var errMalformed = errors.New("ucx: malformed control message")

// The page checksums a receiver verifies Commit with, which the sender
// claims its pages with (WELCOME's checksum field).
const (
	// sumXXH3 is transfer.Checksum over the packed rows, read back into
	// host memory: pages that land in host memory.
	sumXXH3 = 0
	// sumPageSum is kernels.PageSum, which a GPU computes where the pages
	// are: a receiver whose pool is device memory (WithDeviceMemory), so
	// that neither side reads pages back to checksum them.
	sumPageSum = 1
)

// hello is what a sender says first.
type hello struct {
	Room, Epoch uint64
	PID         uint32
	Host        string
	Cap         transfer.Capability
}

// welcome is what the receiver answers to an admitted session.
type welcome struct {
	WorkerAddr []byte
	RKey       []byte
	Base       uint64
	Length     uint64
	PageSize   uint32
	Layers     uint32
	KVHeads    uint32
	HeadDim    uint32
	// DType is the pool's element type: a put's offsets and lengths are
	// in its element size.
	DType uint32
	// Sum is the page checksum Commit is verified with: sumXXH3 or
	// sumPageSum.
	Sum   uint32
	Host  string
	Pages []int32
}

type enc struct{ b []byte }

func (e *enc) u32(v uint32)   { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64)   { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *enc) bytes(p []byte) { e.u32(uint32(len(p))); e.b = append(e.b, p...) }

type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = fmt.Errorf("%w: truncated", errMalformed)
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *dec) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *dec) bytes(limit int) []byte {
	n := d.u32()
	if d.err == nil && int64(n) > int64(limit) {
		d.err = fmt.Errorf("%w: field of %d bytes, limit %d", errMalformed, n, limit)
		return nil
	}
	return append([]byte(nil), d.take(int(n))...)
}

func (d *dec) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", errMalformed, len(d.b))
	}
	return d.err
}

func frame(typ byte, payload []byte) []byte {
	out := make([]byte, ctlHdr, ctlHdr+len(payload))
	out[0], out[1], out[2] = ctlMagic, ctlVersion, typ
	binary.LittleEndian.PutUint32(out[4:], uint32(len(payload)))
	return append(out, payload...)
}

func (h hello) marshal() []byte {
	var e enc
	e.u64(h.Room)
	e.u64(h.Epoch)
	e.u32(h.PID)
	e.bytes([]byte(h.Host))
	e.bytes(h.Cap[:])
	return frame(msgHello, e.b)
}

func parseHello(p []byte) (hello, error) {
	d := dec{b: p}
	h := hello{Room: d.u64(), Epoch: d.u64(), PID: d.u32(), Host: string(d.bytes(256))}
	c, ok := transfer.CapabilityFrom(d.bytes(len(h.Cap)))
	if err := d.end(); err != nil {
		return h, err
	}
	if !ok {
		return h, fmt.Errorf("%w: HELLO without a capability", errMalformed)
	}
	h.Cap = c
	return h, nil
}

func (w welcome) marshal() []byte {
	var e enc
	e.bytes(w.WorkerAddr)
	e.bytes(w.RKey)
	e.u64(w.Base)
	e.u64(w.Length)
	e.u32(w.PageSize)
	e.u32(w.Layers)
	e.u32(w.KVHeads)
	e.u32(w.HeadDim)
	e.u32(w.DType)
	e.u32(w.Sum)
	e.bytes([]byte(w.Host))
	e.u32(uint32(len(w.Pages)))
	for _, p := range w.Pages {
		e.u32(uint32(p))
	}
	return frame(msgWelcome, e.b)
}

func parseWelcome(p []byte) (welcome, error) {
	d := dec{b: p}
	w := welcome{
		WorkerAddr: d.bytes(maxField),
		RKey:       d.bytes(maxField),
		Base:       d.u64(),
		Length:     d.u64(),
		PageSize:   d.u32(),
		Layers:     d.u32(),
		KVHeads:    d.u32(),
		HeadDim:    d.u32(),
		DType:      d.u32(),
		Sum:        d.u32(),
		Host:       string(d.bytes(256)),
	}
	n := d.u32()
	if d.err == nil && int64(n)*4 != int64(len(d.b)) {
		return welcome{}, fmt.Errorf("%w: %d page ids in %d bytes", errMalformed, n, len(d.b))
	}
	if d.err == nil {
		w.Pages = make([]int32, n)
		for i := range w.Pages {
			w.Pages[i] = int32(d.u32())
		}
	}
	if err := d.end(); err != nil {
		return welcome{}, err
	}
	if err := w.check(); err != nil {
		return welcome{}, err
	}
	return w, nil
}

// check validates what a sender will compute remote addresses from: a
// layout whose page fits in the registered length, and page ids inside it;
// and a checksum it knows.
func (w welcome) check() error {
	if w.PageSize == 0 || w.Layers == 0 || w.KVHeads == 0 || w.HeadDim == 0 {
		return fmt.Errorf("%w: layout %d/%d/%d/%d", errMalformed, w.PageSize, w.Layers, w.KVHeads, w.HeadDim)
	}
	if !kernels.ValidKVDType(kernels.DType(w.DType)) {
		return fmt.Errorf("%w: KV dtype %d", errMalformed, w.DType)
	}
	if w.Sum != sumXXH3 && w.Sum != sumPageSum {
		return fmt.Errorf("%w: page checksum %d", errMalformed, w.Sum)
	}
	pb := w.pageBytes()
	if pb == 0 || pb > math.MaxInt32*uint64(4) || w.Length < pb || len(w.WorkerAddr) == 0 || len(w.RKey) == 0 {
		return fmt.Errorf("%w: page of %d bytes, %d registered, %d-byte address, %d-byte key", errMalformed, pb, w.Length, len(w.WorkerAddr), len(w.RKey))
	}
	if w.Base > math.MaxUint64-w.Length {
		return fmt.Errorf("%w: region wraps", errMalformed)
	}
	n := w.Length / pb
	for _, p := range w.Pages {
		if p < 0 || uint64(p) >= n {
			return fmt.Errorf("%w: page %d outside the %d registered pages", errMalformed, p, n)
		}
	}
	return nil
}

// layout is the decode pool's layout the welcome describes (no memory);
// its DType must be valid (check).
func (w welcome) layout() kernels.PagedKV {
	return kernels.PagedKV{PageSize: int(w.PageSize), Layers: int(w.Layers), KVHeads: int(w.KVHeads), HeadDim: int(w.HeadDim), DType: kernels.DType(w.DType)}
}

// pageBytes is one page in bytes, 0 on overflow or an unknown dtype.
func (w welcome) pageBytes() uint64 {
	if !kernels.ValidKVDType(kernels.DType(w.DType)) {
		return 0
	}
	v := uint64(2)
	for _, f := range []uint32{w.PageSize, w.Layers, w.KVHeads, w.HeadDim, uint32(w.layout().ElemBytes())} {
		if v > math.MaxUint64/uint64(f) {
			return 0
		}
		v *= uint64(f)
	}
	return v
}

func refuseMsg(why string) []byte {
	if len(why) > maxText {
		why = why[:maxText]
	}
	return frame(msgRefuse, []byte(why))
}

// readMsg reads one message. A clean EOF before the header is io.EOF.
func readMsg(r io.Reader) (typ byte, payload []byte, err error) {
	var h [ctlHdr]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	if h[0] != ctlMagic || h[1] != ctlVersion || h[3] != 0 {
		return 0, nil, fmt.Errorf("%w: header % x", errMalformed, h[:4])
	}
	typ = h[2]
	n := binary.LittleEndian.Uint32(h[4:])
	limit := uint32(0)
	switch typ {
	case msgHello:
		limit = 1024
	case msgWelcome:
		limit = maxPayload
	case msgRefuse:
		limit = maxText
	case msgEnd, msgClosing:
		limit = 0
	default:
		return 0, nil, fmt.Errorf("%w: type %d", errMalformed, typ)
	}
	if n > limit {
		return 0, nil, fmt.Errorf("%w: type %d with %d bytes, limit %d", errMalformed, typ, n, limit)
	}
	if n == 0 {
		return typ, nil, nil
	}
	// Grown as bytes arrive: a header claiming a large payload costs only
	// what is actually sent.
	buf := make([]byte, 0, min(n, 64<<10))
	for uint32(len(buf)) < n {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, min(int(n)-len(buf), cap(buf)))...)[:len(buf)]
		}
		m, err := r.Read(buf[len(buf):min(cap(buf), int(n))])
		buf = buf[:len(buf)+m]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			if uint32(len(buf)) == n {
				break
			}
			return 0, nil, err
		}
	}
	return typ, buf, nil
}
