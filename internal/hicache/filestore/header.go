package filestore

import (
	"encoding/binary"
	"errors"

	"github.com/zeebo/xxh3"
)

// File layout (all integers little endian):
//
//	off  size  field
//	0    4     magic "BKVP"
//	4    2     version (1)
//	6    2     flags (0; anything else is refused so a later format cannot be misread)
//	8    4     header length in bytes, including the header checksum
//	12   2+n   model fingerprint (uint16 length, bytes)
//	     2+n   layout
//	     2+n   dtype
//	     16    tenant salt hash
//	     16    key (key[0], key[1])
//	     8     page checksum (the caller's, from when the page was published)
//	     8     payload length
//	     8     xxh3-64 of the payload (computed by the store)
//	     8     xxh3-64 of every header byte before this field
//	hdr  len   payload
//
// The header checksum covers the payload checksum, so a flipped bit
// anywhere in the file fails one of the two.
const (
	magic        = "BKVP"
	version      = 1
	prefixLen    = 12
	maxStringLen = 1024
	// fixedLen is every header byte that is not a Meta string.
	fixedLen = prefixLen + 3*2 + 16 + 16 + 8 + 8 + 8 + 8
	// maxHeaderLen bounds what a reader allocates for a header.
	maxHeaderLen = fixedLen + 3*maxStringLen
	// maxPayload bounds a page; KV pages are far smaller, and a bound keeps
	// a corrupt length from turning into a huge read.
	maxPayload = 1 << 30
)

var (
	errShort   = errors.New("filestore: header truncated")
	errMagic   = errors.New("filestore: bad magic")
	errVersion = errors.New("filestore: unknown version or flags")
	errLength  = errors.New("filestore: bad header length")
	errSum     = errors.New("filestore: header checksum mismatch")
)

// header is one file's header, parsed.
type header struct {
	meta       Meta
	salt       [16]byte
	key        [2]uint64
	pageSum    uint64
	payloadLen uint64
	payloadSum uint64
}

func headerLen(m Meta) int {
	return fixedLen + len(m.Fingerprint) + len(m.Layout) + len(m.DType)
}

// appendHeader encodes h after b. The Meta strings must fit maxStringLen
// (Open checks the store's Meta).
func appendHeader(b []byte, h *header) []byte {
	start := len(b)
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(headerLen(h.meta)))
	for _, s := range [3]string{h.meta.Fingerprint, h.meta.Layout, h.meta.DType} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	b = append(b, h.salt[:]...)
	b = binary.LittleEndian.AppendUint64(b, h.key[0])
	b = binary.LittleEndian.AppendUint64(b, h.key[1])
	b = binary.LittleEndian.AppendUint64(b, h.pageSum)
	b = binary.LittleEndian.AppendUint64(b, h.payloadLen)
	b = binary.LittleEndian.AppendUint64(b, h.payloadSum)
	return binary.LittleEndian.AppendUint64(b, xxh3.Hash(b[start:]))
}

// declaredLen reads the header length from a file's first prefixLen bytes,
// after checking magic and version, so a reader knows how much to read.
func declaredLen(b []byte) (int, error) {
	if len(b) < prefixLen {
		return 0, errShort
	}
	if string(b[:4]) != magic {
		return 0, errMagic
	}
	if binary.LittleEndian.Uint16(b[4:]) != version || binary.LittleEndian.Uint16(b[6:]) != 0 {
		return 0, errVersion
	}
	n := binary.LittleEndian.Uint32(b[8:])
	if n < fixedLen || n > maxHeaderLen {
		return 0, errLength
	}
	return int(n), nil
}

// parseHeader decodes the header at the start of b and returns it with
// its length. It never reads past b and accepts only exactly what
// appendHeader writes: every length is bounded, the fields must end
// exactly at the declared length, and the header checksum must match.
func parseHeader(b []byte) (header, int, error) {
	var h header
	n, err := declaredLen(b)
	if err != nil {
		return h, 0, err
	}
	if len(b) < n {
		return h, 0, errShort
	}
	b = b[:n]
	if binary.LittleEndian.Uint64(b[n-8:]) != xxh3.Hash(b[:n-8]) {
		return h, 0, errSum
	}
	off := prefixLen
	var strs [3]string
	for i := range strs {
		if off+2 > n {
			return h, 0, errLength
		}
		l := int(binary.LittleEndian.Uint16(b[off:]))
		off += 2
		if l > maxStringLen || off+l > n {
			return h, 0, errLength
		}
		strs[i] = string(b[off : off+l])
		off += l
	}
	if off+16+16+8+8+8+8 != n {
		return h, 0, errLength
	}
	h.meta = Meta{Fingerprint: strs[0], Layout: strs[1], DType: strs[2]}
	copy(h.salt[:], b[off:])
	off += 16
	h.key[0] = binary.LittleEndian.Uint64(b[off:])
	h.key[1] = binary.LittleEndian.Uint64(b[off+8:])
	h.pageSum = binary.LittleEndian.Uint64(b[off+16:])
	h.payloadLen = binary.LittleEndian.Uint64(b[off+24:])
	h.payloadSum = binary.LittleEndian.Uint64(b[off+32:])
	if h.payloadLen > maxPayload {
		return h, 0, errLength
	}
	return h, n, nil
}
