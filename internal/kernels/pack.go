package kernels

import "fmt"

// PackPage copies the first tokens slots of a page of a pool in Go memory
// into dst in the packed layout (see PackedBytes): for every layer its K
// rows then its V rows, little-endian elements of the pool's dtype, so an
// F16 or BF16 page moves half the bytes of an F32 one. Only written slots
// are packed, so no stale data is ever copied or checksummed. The pool's
// words are little-endian on every host baton builds for, so its bytes
// are the packed elements as they stand.
func PackPage(kv PagedKV, page int32, tokens int, dst []byte) []byte {
	CheckHostKV("PackPage", kv)
	eb, n := kv.ElemBytes(), tokens*kv.RowFloats()*kv.ElemBytes()
	mem := kv.Bytes()
	dst = dst[:0]
	for l := 0; l < kv.Layers; l++ {
		for _, off := range []int{kv.KOffset(int(page), l, 0) * eb, kv.VOffset(int(page), l, 0) * eb} {
			dst = append(dst, mem[off:off+n]...)
		}
	}
	return dst
}

// UnpackPage writes packed rows into the first tokens slots of a page of a
// pool in Go memory: the inverse of PackPage.
func UnpackPage(kv PagedKV, page int32, tokens int, src []byte) error {
	CheckHostKV("UnpackPage", kv)
	if len(src) != kv.PackedBytes(tokens) {
		return fmt.Errorf("kernels: page payload of %d bytes, want %d for %d tokens", len(src), kv.PackedBytes(tokens), tokens)
	}
	eb, n := kv.ElemBytes(), tokens*kv.RowFloats()*kv.ElemBytes()
	mem := kv.Bytes()
	for l := 0; l < kv.Layers; l++ {
		for _, off := range []int{kv.KOffset(int(page), l, 0) * eb, kv.VOffset(int(page), l, 0) * eb} {
			src = src[copy(mem[off:off+n], src):]
		}
	}
	return nil
}
