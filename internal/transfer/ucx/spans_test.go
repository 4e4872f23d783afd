//go:build ucx

package ucx

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// TestWelcomeHalfWidthPages: an f16 or bf16 pool's page is half an f32
// one's (an fp8 pool's a quarter), so the same registered memory holds
// twice (four times) the pages, and a partial page's puts are as much
// shorter at as much smaller offsets.
func TestWelcomeHalfWidthPages(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F16, kernels.BF16, kernels.F8E4M3} {
		eb := kernels.PagedKV{DType: dt}.ElemBytes()
		w := goodWelcome()
		w.DType, w.Pages = uint32(dt), []int32{7, 0}
		_, p, err := readMsg(bytes.NewReader(w.marshal()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseWelcome(p)
		if err != nil {
			t.Fatalf("%s: page 7 of 8 refused: %v", dt, err)
		}
		pb := 1024 * eb
		if n := got.pageBytes(); n != uint64(pb) {
			t.Errorf("%s: page of %d bytes, want %d", dt, n, pb)
		}
		s := &Session{kv: got.layout(), pageBytes: got.pageBytes()}
		spans := s.spans(transfer.PageWrite{Page: 7, Tokens: 3}, transfer.PackedSize(got.layout(), 3))
		// Layer 0's K block starts the page; its V block is 16 slots of 16
		// elements further; layer 1's K block 16 slots after that.
		row, blk := 48*eb, 256*eb
		at := func(k int) uint64 { return uint64(7*pb + k*blk) }
		want := []span{{0, row, at(0)}, {row, row, at(1)}, {2 * row, row, at(2)}, {3 * row, row, at(3)}}
		if !reflect.DeepEqual(spans, want) {
			t.Errorf("%s: spans %v, want %v", dt, spans, want)
		}
	}
}
