package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/batonlm/baton/internal/transfer"
)

// Wire format. Every frame starts with the same 32-byte header, little
// endian:
//
//	0      magic 0xBA
//	1      version 1
//	2      frame type
//	3      flags, must be 0
//	4..8   payload length (uint32)
//	8..16  field a
//	16..24 field b
//	24..32 field c
//
// followed by the payload. Per type:
//
//	HELLO      a room, b epoch; payload the reservation's capability (32 bytes).
//	           First frame of a session, sender to receiver.
//	PAGE       a index, b page id (int32 as int64), c tokens; payload the packed rows.
//	FLUSH      a sequence number; no payload.
//	FLUSH_ACK  a sequence number, b payload bytes landed so far; payload the
//	           session's first refusal as text, empty if none. Receiver to sender.
//	ARENA      no fields; payload the handle of the sender's device arena
//	           (kernels.Arena), at most once a session, before its first REF.
//	REF        a index, b page id, c tokens, as PAGE; payload 8 bytes, the
//	           byte offset in the arena where the packed rows are staged.
//	           The receiver copies them from there itself (cuda-ipc).
//
// A fixed header keeps decoding to one bounded read and a table of checks;
// fields a type does not use must be zero so that garbage is caught early
// rather than half-understood.
const (
	hdrSize = 32
	capSize = len(transfer.Capability{})
	magic   = 0xBA
	version = 2

	frameHello = 1
	framePage  = 2
	frameFlush = 3
	frameAck   = 4
	frameArena = 5
	frameRef   = 6

	// maxHandle bounds an ARENA payload (a CUDA IPC handle is 64 bytes).
	maxHandle = 256
	refSize   = 8

	// maxAckText bounds the refusal text an ack carries: the sender's read
	// of an ack is then bounded no matter what the receiver claims.
	maxAckText = 4096

	// growStep is the first allocation for a payload larger than the
	// buffer held: the buffer then grows only as bytes actually arrive, so
	// a header that claims a large payload and never sends it costs little.
	growStep = 1 << 20
)

// errMalformed is wrapped by every decoding error caused by the bytes
// themselves (as opposed to the connection).
var errMalformed = errors.New("tcp: malformed frame")

// header is a decoded frame header.
type header struct {
	typ     byte
	length  int
	a, b, c uint64
}

func putHeader(dst []byte, typ byte, length int, a, b, c uint64) {
	_ = dst[hdrSize-1]
	dst[0] = magic
	dst[1] = version
	dst[2] = typ
	dst[3] = 0
	binary.LittleEndian.PutUint32(dst[4:], uint32(length))
	binary.LittleEndian.PutUint64(dst[8:], a)
	binary.LittleEndian.PutUint64(dst[16:], b)
	binary.LittleEndian.PutUint64(dst[24:], c)
}

// decodeHeader checks everything the header alone can tell: magic,
// version, known type, and for each type which fields may be set and how
// long the payload may be. maxPayload bounds PAGE payloads.
func decodeHeader(src []byte, maxPayload int) (header, error) {
	_ = src[hdrSize-1]
	if src[0] != magic {
		return header{}, fmt.Errorf("%w: bad magic %#x", errMalformed, src[0])
	}
	if src[1] != version {
		return header{}, fmt.Errorf("%w: version %d, want %d", errMalformed, src[1], version)
	}
	if src[3] != 0 {
		return header{}, fmt.Errorf("%w: flags %#x", errMalformed, src[3])
	}
	h := header{
		typ:    src[2],
		length: int(binary.LittleEndian.Uint32(src[4:])),
		a:      binary.LittleEndian.Uint64(src[8:]),
		b:      binary.LittleEndian.Uint64(src[16:]),
		c:      binary.LittleEndian.Uint64(src[24:]),
	}
	switch h.typ {
	case frameHello:
		if h.length != capSize || h.c != 0 {
			return header{}, fmt.Errorf("%w: HELLO without a capability or with extra fields", errMalformed)
		}
	case framePage, frameRef:
		if h.typ == framePage && h.length > maxPayload {
			return header{}, fmt.Errorf("%w: page payload of %d bytes, limit %d", errMalformed, h.length, maxPayload)
		}
		if h.typ == frameRef && h.length != refSize {
			return header{}, fmt.Errorf("%w: REF payload of %d bytes, want %d", errMalformed, h.length, refSize)
		}
		if h.a > math.MaxInt32 {
			return header{}, fmt.Errorf("%w: page index %d", errMalformed, h.a)
		}
		if p := int64(h.b); p < math.MinInt32 || p > math.MaxInt32 {
			return header{}, fmt.Errorf("%w: page id %d", errMalformed, p)
		}
		if h.c > math.MaxInt32 {
			return header{}, fmt.Errorf("%w: page tokens %d", errMalformed, h.c)
		}
	case frameArena:
		if h.length == 0 || h.length > maxHandle || h.a != 0 || h.b != 0 || h.c != 0 {
			return header{}, fmt.Errorf("%w: ARENA with a handle of %d bytes or extra fields", errMalformed, h.length)
		}
	case frameFlush:
		if h.length != 0 || h.b != 0 || h.c != 0 {
			return header{}, fmt.Errorf("%w: FLUSH with payload or extra fields", errMalformed)
		}
	case frameAck:
		if h.length > maxAckText {
			return header{}, fmt.Errorf("%w: ack text of %d bytes, limit %d", errMalformed, h.length, maxAckText)
		}
		if h.c != 0 || h.b > math.MaxInt64 {
			return header{}, fmt.Errorf("%w: FLUSH_ACK fields", errMalformed)
		}
	default:
		return header{}, fmt.Errorf("%w: unknown frame type %d", errMalformed, h.typ)
	}
	return h, nil
}

// readPayload reads n bytes into buf, reusing it when it is large enough.
// Otherwise it grows it as the bytes arrive rather than trusting n up
// front, so a peer has to send a byte for every byte it makes us hold.
// The returned buffer is the one to keep for the next frame.
func readPayload(r io.Reader, buf []byte, n int) (payload, keep []byte, err error) {
	if n <= cap(buf) {
		p := buf[:n]
		_, err := io.ReadFull(r, p)
		return p, buf, err
	}
	p := buf[:0]
	for len(p) < n {
		if len(p) == cap(p) {
			np := make([]byte, len(p), min(n, max(2*cap(p), growStep)))
			copy(np, p)
			p = np
		}
		m, err := io.ReadFull(r, p[len(p):cap(p)])
		p = p[:len(p)+m]
		if err != nil {
			if err == io.EOF && len(p) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return p, p, err
		}
	}
	return p, p, nil
}

// readFrame reads one frame. A clean EOF before the first header byte is
// io.EOF; a frame cut short is io.ErrUnexpectedEOF; bad contents wrap
// errMalformed.
func readFrame(r io.Reader, hdr *[hdrSize]byte, buf []byte, maxPayload int) (h header, payload, keep []byte, err error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return header{}, nil, buf, err
	}
	h, err = decodeHeader(hdr[:], maxPayload)
	if err != nil {
		return header{}, nil, buf, err
	}
	if h.length == 0 {
		return h, nil, buf, nil
	}
	payload, buf, err = readPayload(r, buf, h.length)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return h, payload, buf, err
}
