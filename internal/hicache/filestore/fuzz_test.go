package filestore

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/zeebo/xxh3"
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
		check(t, b)
		// Random bytes almost never carry a right checksum; with it fixed
		// up, the fuzzer reaches the field parsing behind it.
		if n, err := declaredLen(b); err == nil && n <= len(b) {
			fixed := append([]byte(nil), b...)
			binary.LittleEndian.PutUint64(fixed[n-8:], xxh3.Hash(fixed[:n-8]))
			check(t, fixed)
		}
	})
}

func check(t *testing.T, b []byte) {
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

// resum rewrites the header checksum of b so that only the change a test
// made is left to refuse.
func resum(b []byte) []byte {
	n := int(binary.LittleEndian.Uint32(b[8:]))
	binary.LittleEndian.PutUint64(b[n-8:], xxh3.Hash(b[:n-8]))
	return b
}

func TestHeaderRefusesWellSummedOddities(t *testing.T) {
	h := header{meta: metaA, salt: saltX, key: [2]uint64{1, 2}, payloadLen: 64}
	valid := appendHeader(nil, &h)
	cases := map[string]func([]byte) []byte{
		"flags":   func(b []byte) []byte { b[6] = 1; return resum(b) },
		"version": func(b []byte) []byte { b[4] = 2; return resum(b) },
		"slack after the fields": func(b []byte) []byte {
			b = append(b[:len(b)-8:len(b)-8], 0, 0, 0, 0, 0, 0, 0, 0, 0)
			binary.LittleEndian.PutUint32(b[8:], uint32(len(b)))
			return resum(b)
		},
		"string past the header": func(b []byte) []byte {
			binary.LittleEndian.PutUint16(b[prefixLen:], uint16(len(b)))
			return resum(b)
		},
		"string over the limit": func([]byte) []byte {
			long := h
			long.meta.Layout = string(make([]byte, maxStringLen+1))
			return appendHeader(nil, &long)
		},
		"payload over the limit": func([]byte) []byte {
			big := h
			big.payloadLen = maxPayload + 1
			return appendHeader(nil, &big)
		},
	}
	for name, mutate := range cases {
		b := mutate(append([]byte(nil), valid...))
		if _, _, err := parseHeader(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
