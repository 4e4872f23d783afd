package filestore

import (
	"bytes"
	"testing"
)

// FuzzHeader feeds the header parser arbitrary bytes: it must never panic
// or read past its input, and whatever it accepts must be exactly what the
// writer would have written for the parsed fields (so no two byte strings
// parse to one header, and no damage slips through as a valid header).
func FuzzHeader(f *testing.F) {
	h := header{meta: metaA, salt: saltX, key: [2]uint64{1, 2}, pageSum: 3, payloadLen: 4096, payloadSum: 5}
	valid := appendHeader(nil, &h)
	f.Add(valid)
	f.Add(append(append([]byte(nil), valid...), "payload"...))
	f.Add(valid[:prefixLen])
	f.Add(valid[:len(valid)-1])
	f.Add(appendHeader(nil, &header{}))
	long := header{meta: Meta{Fingerprint: string(bytes.Repeat([]byte{'f'}, maxStringLen))}, payloadLen: maxPayload}
	f.Add(appendHeader(nil, &long))
	f.Add([]byte(magic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := parseHeader(b)
		if err != nil {
			return
		}
		if n > len(b) || n != headerLen(h.meta) {
			t.Fatalf("parsed length %d of %d bytes, header length %d", n, len(b), headerLen(h.meta))
		}
		if again := appendHeader(nil, &h); !bytes.Equal(again, b[:n]) {
			t.Fatalf("accepted bytes differ from their re-encoding:\n%x\n%x", b[:n], again)
		}
		if r, m, err := readHeader(bytes.NewReader(b)); err != nil || m != n || r != h {
			t.Fatalf("readHeader disagrees with parseHeader: %v %d %+v", err, m, r)
		}
	})
}

func TestHeaderRoundTrip(t *testing.T) {
	h := header{meta: metaB, salt: saltY, key: [2]uint64{^uint64(0), 7}, pageSum: 11, payloadLen: 65536, payloadSum: 13}
	b := appendHeader(nil, &h)
	got, n, err := parseHeader(append(b, 0xFF))
	if err != nil || n != len(b) || got != h {
		t.Fatalf("parse: %v n=%d %+v", err, n, got)
	}
	for i := range b {
		if _, _, err := parseHeader(b[:i]); err == nil {
			t.Fatalf("a header cut at %d parsed", i)
		}
	}
}
