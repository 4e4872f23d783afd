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
// one's, so the same registered memory holds twice the pages, and a
// partial page's puts are half as long at half the offsets.
func TestWelcomeHalfWidthPages(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F16, kernels.BF16} {
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
		if pb := got.pageBytes(); pb != 2048 {
			t.Errorf("%s: page of %d bytes, want 2048", dt, pb)
		}
		s := &Session{kv: got.layout(), pageBytes: got.pageBytes()}
		spans := s.spans(transfer.PageWrite{Page: 7, Tokens: 3}, transfer.PackedSize(got.layout(), 3))
		// Layer 0's K block starts the page; its V block is 16 slots of 16
		// two-byte elements further; layer 1's K block 16 slots after that.
		want := []span{{0, 96, 7 * 2048}, {96, 96, 7*2048 + 512}, {192, 96, 7*2048 + 1024}, {288, 96, 7*2048 + 1536}}
		if !reflect.DeepEqual(spans, want) {
			t.Errorf("%s: spans %v, want %v", dt, spans, want)
		}
	}
}
