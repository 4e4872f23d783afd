package filestore

import (
	"crypto/hmac"
	"encoding/binary"
	"errors"
)

// File layout (all integers little endian):
//
//	off  size  field
//	0    4     magic "BKVP"
//	4    2     version (2)
//	6    2     flags (0; anything else is refused so a later format cannot be misread)
//	8    4     header length in bytes, including the header MAC
//	12   2+n   model fingerprint (uint16 length, bytes)
//	     2+n   layout
//	     2+n   dtype
//	     16    tenant tag: HMAC-SHA-256 of the caller's tenant hash under the store key, cut to 16 bytes
//	     16    key (key[0], key[1])
//	     8     page checksum (the caller's, from when the page was published)
//	     8     payload length
//	     32    payload MAC: HMAC-SHA-256 of every header byte before this field, then the payload
//	     32    header MAC: HMAC-SHA-256 of every header byte before this field
//	hdr  len   payload
//
// Both MACs are under the store key (seal.go), which is kept outside the
// directory: whoever can write the directory but not read the key can
// neither make a file the store serves nor move one to another name, since
// the header MAC covers the Meta, tenant, key and page checksum the name
// and the reader are checked against. The header MAC alone lets Open index
// a file without reading its payload; the payload MAC, which the header
// MAC covers, is checked at Get. A flipped bit anywhere fails one of them.
//
// Version 1 kept plain xxh3 sums (anyone could recompute them) and an
// unkeyed tenant hash (an offline guess of the API key); its files are
// refused as of another version, so they are removed and computed again.
const (
	magic        = "BKVP"
	version      = 2
	prefixLen    = 12
	maxStringLen = 1024
	// fixedLen is every header byte that is not a Meta string.
	fixedLen = prefixLen + 3*2 + 16 + 16 + 8 + 8 + tagLen + tagLen
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
	// errForged is a header whose MAC does not verify under the store key:
	// written or altered by someone without the key (or damaged).
	errForged = errors.New("filestore: header MAC mismatch")
)

// header is one file's header, parsed.
type header struct {
	meta       Meta
	tenant     [16]byte // the store's keyed tag of the tenant, never the caller's hash
	key        [2]uint64
	pageSum    uint64
	payloadLen uint64
	payloadMAC [tagLen]byte
}

func headerLen(m Meta) int {
	return fixedLen + len(m.Fingerprint) + len(m.Layout) + len(m.DType)
}

// appendFields encodes every header field before the payload MAC: the
// bytes the payload MAC starts from. The Meta strings must fit
// maxStringLen (Open checks the store's Meta).
func appendFields(b []byte, h *header) []byte {
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(headerLen(h.meta)))
	for _, s := range [3]string{h.meta.Fingerprint, h.meta.Layout, h.meta.DType} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	b = append(b, h.tenant[:]...)
	b = binary.LittleEndian.AppendUint64(b, h.key[0])
	b = binary.LittleEndian.AppendUint64(b, h.key[1])
	b = binary.LittleEndian.AppendUint64(b, h.pageSum)
	return binary.LittleEndian.AppendUint64(b, h.payloadLen)
}

// appendHeader encodes h after b and seals it under k.
func appendHeader(b []byte, h *header, k *sealKey) []byte {
	start := len(b)
	b = appendFields(b, h)
	b = append(b, h.payloadMAC[:]...)
	m := k.mac(labelHeader)
	m.Write(b[start:])
	return m.Sum(b)
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

// parseHeader decodes the header at the start of b, sealed under k, and
// returns it with its length. It never reads past b and accepts only
// exactly what appendHeader writes: the MAC is checked before any field
// is read, every length is bounded, and the fields must end exactly at
// the declared length.
func parseHeader(b []byte, k *sealKey) (header, int, error) {
	var h header
	n, err := declaredLen(b)
	if err != nil {
		return h, 0, err
	}
	if len(b) < n {
		return h, 0, errShort
	}
	b = b[:n]
	m := k.mac(labelHeader)
	m.Write(b[:n-tagLen])
	if !hmac.Equal(m.Sum(nil), b[n-tagLen:]) {
		return h, 0, errForged
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
	if off+16+16+8+8+tagLen+tagLen != n {
		return h, 0, errLength
	}
	h.meta = Meta{Fingerprint: strs[0], Layout: strs[1], DType: strs[2]}
	copy(h.tenant[:], b[off:])
	off += 16
	h.key[0] = binary.LittleEndian.Uint64(b[off:])
	h.key[1] = binary.LittleEndian.Uint64(b[off+8:])
	h.pageSum = binary.LittleEndian.Uint64(b[off+16:])
	h.payloadLen = binary.LittleEndian.Uint64(b[off+24:])
	copy(h.payloadMAC[:], b[off+32:])
	if h.payloadLen > maxPayload {
		return h, 0, errLength
	}
	return h, n, nil
}
