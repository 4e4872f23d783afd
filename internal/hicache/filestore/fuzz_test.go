package filestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// testKey seals the headers these tests encode and parse by hand.
var testKey = &sealKey{0: 0x5e, 7: 0xa1, 31: 0x0c}

// FuzzHeader feeds the header parser arbitrary bytes: it must never panic
// or read past its input, and whatever it accepts must be exactly what the
// writer would have written for the parsed fields (so no two byte strings
// parse to one header, and no damage slips through as a valid header).
func FuzzHeader(f *testing.F) {
	h := header{meta: metaA, tenant: saltX, key: [2]uint64{1, 2}, pageSum: 3, payloadLen: 4096, payloadMAC: [tagLen]byte{5}}
	valid := appendHeader(nil, &h, testKey)
	f.Add(valid)
	f.Add(append(append([]byte(nil), valid...), "payload"...))
	f.Add(valid[:prefixLen])
	f.Add(valid[:len(valid)-1])
	f.Add(appendHeader(nil, &header{}, testKey))
	long := header{meta: Meta{Fingerprint: string(bytes.Repeat([]byte{'f'}, maxStringLen))}, payloadLen: maxPayload}
	f.Add(appendHeader(nil, &long, testKey))
	// Sealed under another key, and the version 1 layout (plain xxh3 sums):
	// both refused.
	f.Add(appendHeader(nil, &h, &sealKey{1}))
	f.Add(legacyFile(metaA, saltX, [2]uint64{1, 2}, make([]byte, 64), 3))
	f.Add([]byte(magic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		check(t, b)
		// Random bytes never carry a right MAC; with it fixed up (as only
		// the key's holder can), the fuzzer reaches the field parsing
		// behind it.
		if n, err := declaredLen(b); err == nil && n <= len(b) {
			check(t, reseal(append([]byte(nil), b...), testKey))
		}
	})
}

func check(t *testing.T, b []byte) {
	h, n, err := parseHeader(b, testKey)
	if err != nil {
		return
	}
	if n > len(b) || n != headerLen(h.meta) {
		t.Fatalf("parsed length %d of %d bytes, header length %d", n, len(b), headerLen(h.meta))
	}
	if again := appendHeader(nil, &h, testKey); !bytes.Equal(again, b[:n]) {
		t.Fatalf("accepted bytes differ from their re-encoding:\n%x\n%x", b[:n], again)
	}
	var buf [maxHeaderLen]byte
	if r, m, err := readHeader(bytes.NewReader(b), &buf, testKey); err != nil || m != n || r != h {
		t.Fatalf("readHeader disagrees with parseHeader: %v %d %+v", err, m, r)
	}
	if _, _, err := parseHeader(b, &sealKey{1}); err == nil {
		t.Fatal("a header sealed under one key parsed under another")
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	h := header{meta: metaB, tenant: saltY, key: [2]uint64{^uint64(0), 7}, pageSum: 11, payloadLen: 65536, payloadMAC: [tagLen]byte{13, 31: 1}}
	b := appendHeader(nil, &h, testKey)
	got, n, err := parseHeader(append(b, 0xFF), testKey)
	if err != nil || n != len(b) || got != h {
		t.Fatalf("parse: %v n=%d %+v", err, n, got)
	}
	for i := range b {
		if _, _, err := parseHeader(b[:i], testKey); err == nil {
			t.Fatalf("a header cut at %d parsed", i)
		}
	}
}

// reseal rewrites the header MAC of b under k so that only the change a
// test made is left to refuse.
func reseal(b []byte, k *sealKey) []byte {
	n := int(binary.LittleEndian.Uint32(b[8:]))
	m := k.mac(labelHeader)
	m.Write(b[:n-tagLen])
	m.Sum(b[n-tagLen : n-tagLen])
	return b
}

// Only the key's holder could write these; the parser still accepts
// nothing but what appendHeader writes.
func TestHeaderRefusesWellSealedOddities(t *testing.T) {
	h := header{meta: metaA, tenant: saltX, key: [2]uint64{1, 2}, payloadLen: 64}
	valid := appendHeader(nil, &h, testKey)
	cases := map[string]func([]byte) []byte{
		"flags":     func(b []byte) []byte { b[6] = 1; return reseal(b, testKey) },
		"version 1": func(b []byte) []byte { b[4] = 1; return reseal(b, testKey) },
		"version 3": func(b []byte) []byte { b[4] = 3; return reseal(b, testKey) },
		"slack after the fields": func(b []byte) []byte {
			b = append(b[:len(b)-tagLen:len(b)-tagLen], make([]byte, tagLen+1)...)
			binary.LittleEndian.PutUint32(b[8:], uint32(len(b)))
			return reseal(b, testKey)
		},
		"string past the header": func(b []byte) []byte {
			binary.LittleEndian.PutUint16(b[prefixLen:], uint16(len(b)))
			return reseal(b, testKey)
		},
		"string over the limit": func([]byte) []byte {
			long := h
			long.meta.Layout = string(make([]byte, maxStringLen+1))
			return appendHeader(nil, &long, testKey)
		},
		"payload over the limit": func([]byte) []byte {
			big := h
			big.payloadLen = maxPayload + 1
			return appendHeader(nil, &big, testKey)
		},
	}
	for name, mutate := range cases {
		b := mutate(append([]byte(nil), valid...))
		if _, _, err := parseHeader(b, testKey); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, _, err := parseHeader(valid, testKey); err != nil {
		t.Fatalf("the unaltered header: %v", err)
	}
	// Any field changed without the key: the MAC refuses it.
	for i := prefixLen; i < len(valid); i++ {
		b := append([]byte(nil), valid...)
		b[i] ^= 0x10
		if _, _, err := parseHeader(b, testKey); !errors.Is(err, errForged) {
			t.Fatalf("byte %d changed: %v, want errForged", i, err)
		}
	}
}
