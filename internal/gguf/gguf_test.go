package gguf

import (
	"bytes"
	"encoding/binary"
	"os"
	"slices"
	"testing"

	"github.com/batonlm/baton/internal/bundled"
)

func TestOpenBundledVocab(t *testing.T) {
	f, err := Open("../../testdata/vocab/ggml-vocab-llama-spm.gguf")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if arch, _ := f.String("general.architecture"); arch != "llama" {
		t.Fatalf("architecture %q", arch)
	}
	toks, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok || len(toks) != 32000 || toks[1] != "<s>" {
		t.Fatalf("tokens: %d", len(toks))
	}
	if n, ok := f.Uint("llama.context_length"); !ok || n != 4096 {
		t.Fatalf("context length %d %v", n, ok)
	}
	if b, ok := f.Bool("tokenizer.ggml.add_bos_token"); !ok || !b {
		t.Fatal("add_bos_token")
	}
}

// build writes a minimal GGUF v3 image with one string key and one F32 tensor.
func build(tensorDims []uint64, tensorOffset uint64, dataLen int) []byte {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { w(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	w(uint32(3))
	w(uint64(1)) // tensors
	w(uint64(1)) // keys
	str("general.architecture")
	w(uint32(8))
	str("llama")
	str("t")
	w(uint32(len(tensorDims)))
	for _, d := range tensorDims {
		w(d)
	}
	w(uint32(0)) // F32
	w(tensorOffset)
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	b.Write(make([]byte, dataLen))
	return b.Bytes()
}

func TestParseRejectsMalformed(t *testing.T) {
	good := build([]uint64{4, 2}, 0, 32)
	f, err := Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	if _, data, err := f.Tensor("t"); err != nil || len(data) != 32 {
		t.Fatalf("tensor: %v %d", err, len(data))
	}
	for name, img := range map[string][]byte{
		"bad magic":       append([]byte("GGUX"), good[4:]...),
		"truncated":       good[:40],
		"tensor past end": build([]uint64{4, 2}, 0, 16),
		"offset past end": build([]uint64{4, 2}, 1<<40, 32),
		"too many dims":   build([]uint64{1, 1, 1, 1, 1}, 0, 32),
		"huge dim":        build([]uint64{1 << 50}, 0, 32),
		"unsupported ver": append(append([]byte("GGUF"), 9, 0, 0, 0), good[8:]...),
		"empty":           nil,
		"count overflow":  append(append([]byte("GGUF"), 3, 0, 0, 0), bytes.Repeat([]byte{0xff}, 16)...),
	} {
		if _, err := Parse(img); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzParse: any byte string either parses, with every tensor inside the
// image, or fails cleanly; it never panics.
func FuzzParse(f *testing.F) {
	f.Add(build([]uint64{4, 2}, 0, 32))
	if b, err := os.ReadFile("../../testdata/vocab/ggml-vocab-llama-spm.gguf"); err == nil {
		f.Add(b[:4096])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Parse(data)
		if err != nil {
			return
		}
		for _, ti := range g.Tensors {
			if _, b, err := g.Tensor(ti.Name); err == nil && len(b) != int(ti.Size) {
				t.Fatalf("tensor %s: %d bytes, size %d", ti.Name, len(b), ti.Size)
			}
		}
	})
}

// A metadata-only copy parses, with every key and no tensor.
func TestMetadataOnly(t *testing.T) {
	f, err := Parse(bundled.Stories260K)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(f.MetadataOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Tensors) != 0 || !slices.Equal(m.Keys, f.Keys) || len(m.MetadataOnly()) >= len(bundled.Stories260K)/2 {
		t.Fatalf("%d tensors, keys %v (want %v)", len(m.Tensors), m.Keys, f.Keys)
	}
	if a, _ := m.Strings("tokenizer.ggml.tokens"); len(a) == 0 {
		t.Fatal("no tokenizer in the copy")
	}
}
