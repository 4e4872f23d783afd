package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
)

// PackPage copies the first tokens slots of a page of a pool in Go memory
// into dst in the packed layout (see PackedBytes): for every layer its K
// rows then its V rows, little-endian elements of the pool's dtype, so an
// F16 or BF16 page moves half the bytes of an F32 one. Only written slots
// are packed, so no stale data is ever copied or checksummed.
func PackPage(kv PagedKV, page int32, tokens int, dst []byte) []byte {
	CheckHostKV("PackPage", kv)
	n := tokens * kv.RowFloats()
	dst = dst[:0]
	for l := 0; l < kv.Layers; l++ {
		for _, off := range []int{kv.KOffset(int(page), l, 0), kv.VOffset(int(page), l, 0)} {
			if kv.DType == F32 {
				for _, v := range kv.Data[off : off+n] {
					dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
				}
				continue
			}
			for _, h := range kv.Halves()[off : off+n] {
				dst = binary.LittleEndian.AppendUint16(dst, h)
			}
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
	n := tokens * kv.RowFloats()
	i := 0
	for l := 0; l < kv.Layers; l++ {
		for _, off := range []int{kv.KOffset(int(page), l, 0), kv.VOffset(int(page), l, 0)} {
			if kv.DType == F32 {
				dst := kv.Data[off : off+n]
				for j := range dst {
					dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(src[i:]))
					i += 4
				}
				continue
			}
			dst := kv.Halves()[off : off+n]
			for j := range dst {
				dst[j] = binary.LittleEndian.Uint16(src[i:])
				i += 2
			}
		}
	}
	return nil
}
