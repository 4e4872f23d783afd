package model

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
)

// A model loaded with HostCopy serves from weights of its own, outside the
// file's mapping, with logits bit-identical to the mapped model's, and
// Close releases both.
func TestHostCopyServesTheSameWeights(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, bundled.Stories260K, 0o600); err != nil {
		t.Fatal(err)
	}
	be := cpu.New(0)
	logits := func(host bool) []float32 {
		l, err := Load(LoadOptions{Path: path, HostCopy: host}, be)
		if err != nil {
			t.Fatal(err)
		}
		if l.Copied != host {
			t.Fatalf("HostCopy %v: Copied %v", host, l.Copied)
		}
		m := l.Model
		// The file's mapping: from its first tensor's bytes to its last's.
		lo, hi := ^uintptr(0), uintptr(0)
		for _, ti := range l.GGUF.Tensors {
			_, b, err := l.GGUF.Tensor(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			lo, hi = min(lo, p), max(hi, p+uintptr(len(b)))
		}
		for _, x := range m.Weights.matrices() {
			p := uintptr(unsafe.Pointer(unsafe.SliceData(x.Data)))
			if inFile := p >= lo && p < hi; inFile == host {
				t.Fatalf("HostCopy %v: a %dx%d matrix is in the file's mapping: %v", host, x.Rows, x.Cols, inFile)
			}
		}
		c := m.Config
		kv := kernels.PagedKV{PageSize: 16, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
		kv.Data = make([]float32, 2*kv.PageFloats())
		b := &Batch{Seqs: []kernels.AttnSeq{{Pages: []int32{0, 1}, QLen: 20, KVLen: 20}}}
		for p := range 20 {
			b.Tokens = append(b.Tokens, int32(1+(p*37)%(c.Vocab-1)))
			b.Positions = append(b.Positions, int32(p))
			b.Slots = append(b.Slots, int32(p))
		}
		out, err := m.Forward(b, kv)
		if err != nil {
			t.Fatal(err)
		}
		out = slices.Clone(out)
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	mapped, copied := logits(false), logits(true)
	if !slices.Equal(mapped, copied) {
		t.Fatal("logits differ between the mapped and the copied weights")
	}

	// Where the copy would not leave copyReserve of the available memory,
	// the model is served from the mapping instead.
	defer func(f func() (int64, error)) { memAvailable = f }(memAvailable)
	memAvailable = func() (int64, error) { return copyReserve, nil }
	l, err := Load(LoadOptions{Path: path, HostCopy: true}, be)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Model.Close()
	if l.Copied {
		t.Fatal("weights copied with no room for them")
	}
}
