package kernels

import (
	"encoding/binary"
	"math"
)

// The quantised formats of ggml (GGUF files), as laid out on disk. Every
// block starts over: a row is a whole number of blocks. "Type-0" formats
// store w = d·q, "type-1" formats w = d·q + m (Q4_1, Q5_1) or
// w = d·sc·q - dmin·m (Q4_K, Q5_K). All scales are IEEE halves except the
// 6- and 8-bit sub-block scales of the K formats.
//
//	Q4_0  32 elements, 18 bytes: d; 16 bytes of nibbles, element j in the low
//	      nibble of byte j, element j+16 in the high one; q-8.
//	Q4_1  32 elements, 20 bytes: d, m; nibbles as Q4_0; q unsigned.
//	Q5_0  32 elements, 22 bytes: d; 32 high bits (bit j of a little-endian
//	      uint32 is bit 4 of element j); nibbles as Q4_0; q-16.
//	Q5_1  32 elements, 24 bytes: d, m; high bits; nibbles; q unsigned.
//	Q4_K  256 elements, 144 bytes: d, dmin; 12 bytes packing eight 6-bit
//	      scales and eight 6-bit mins (see scaleMinK); 128 bytes of nibbles
//	      in four runs of 32 bytes, run r holding sub-block 2r in its low
//	      nibbles and sub-block 2r+1 in its high nibbles.
//	Q5_K  256 elements, 176 bytes: as Q4_K with 32 bytes of high bits after
//	      the scales: bit 2r of byte l is bit 4 of element l of sub-block
//	      2r, bit 2r+1 that of sub-block 2r+1.
//	Q6_K  256 elements, 210 bytes: 128 bytes of low nibbles, 64 bytes of
//	      2-bit high parts, sixteen int8 scales (one per 16 elements), d.
//	      Each half of 128 elements uses 64 low bytes, 32 high bytes and 8
//	      scales: element l (l < 32) of quarter k takes the low (k even) or
//	      high (k odd) nibble of low byte l + 32·(k%2) and bits 2k..2k+1 of
//	      high byte l; q-32.
//	Q3_K  256 elements, 110 bytes: 32 bytes of high bits, 64 bytes of 2-bit
//	      quants, 12 bytes packing sixteen 6-bit scales (see scaleQ3K), d.
//	      Each half of 128 elements uses 32 quant bytes: element l of
//	      quarter k takes bits 2k..2k+1 of byte l and, as its third bit, bit
//	      4h+k of high byte l; q-4. Scale of elements 16g..16g+15: scale g,
//	      minus 32.
//	Q2_K  256 elements, 84 bytes: sixteen bytes of scales (low nibble a
//	      4-bit scale, high nibble a 4-bit min, one pair per 16 elements),
//	      64 bytes of 2-bit quants, d, dmin. Each half of 128 elements uses
//	      32 quant bytes: element l of quarter k takes bits 2k..2k+1 of byte
//	      l; w = d·sc·q - dmin·m, q unsigned.
type dtypeDesc struct {
	name  string
	block int // elements per block
	bytes int // bytes per block
}

var dtypeInfo = [...]dtypeDesc{
	F32:  {"f32", 1, 4},
	F16:  {"f16", 1, 2},
	Q8_0: {"q8_0", 32, 34},
	BF16: {"bf16", 1, 2},
	Q4_0: {"q4_0", 32, 18},
	Q4_1: {"q4_1", 32, 20},
	Q5_0: {"q5_0", 32, 22},
	Q5_1: {"q5_1", 32, 24},
	Q4_K: {"q4_k", 256, 144},
	Q5_K: {"q5_k", 256, 176},
	Q6_K: {"q6_k", 256, 210},
	Q3_K: {"q3_k", 256, 110},
	Q2_K: {"q2_k", 256, 84},

	F8E4M3: {"fp8_e4m3", 1, 1},
}

// QuantDTypes are the block formats beyond Q8_0, in declaration order.
var QuantDTypes = []DType{Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K}

// scaleQ3K unpacks scale g (0..15, before the -32) of a Q3_K block: low 4
// bits from the low (g < 8) or high nibble of byte g%8, top 2 bits from
// bits 2(g/4)..2(g/4)+1 of byte 8+g%4.
func scaleQ3K(s []byte, g int) int {
	lo := s[g%8] & 15
	if g >= 8 {
		lo = s[g%8] >> 4
	}
	return int(lo | (s[8+g%4]>>(2*(g/4))&3)<<4)
}

func half(b []byte) float32 { return F16ToF32(binary.LittleEndian.Uint16(b)) }

// scaleMinK unpacks scale and min j (0..7) of a Q4_K/Q5_K block: the first
// four pairs are the low 6 bits of bytes j and j+4; the last four take
// their low 4 bits from the nibbles of byte j+4 and their top 2 bits from
// the spare top bits of bytes j-4 (scale) and j (min).
func scaleMinK(s []byte, j int) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&15 | s[j-4]>>6<<4, s[j+4]>>4 | s[j]>>6<<4
}

// decodeRow dequantises one row of a ggml block format: the definition the
// kernels are tested against.
func decodeRow(dt DType, b []byte, dst []float32) {
	in := dtypeInfo[dt]
	for blk := 0; blk < len(dst)/in.block; blk++ {
		q := b[blk*in.bytes : (blk+1)*in.bytes]
		y := dst[blk*in.block : (blk+1)*in.block]
		switch dt {
		case Q4_0, Q4_1:
			d, m, qs := half(q), float32(0), q[2:]
			if dt == Q4_1 {
				m, qs = half(q[2:]), q[4:]
			}
			for j := 0; j < 16; j++ {
				lo, hi := int(qs[j]&15), int(qs[j]>>4)
				if dt == Q4_0 {
					y[j], y[j+16] = d*float32(lo-8), d*float32(hi-8)
				} else {
					y[j], y[j+16] = float32(d*float32(lo))+m, float32(d*float32(hi))+m
				}
			}
		case Q5_0, Q5_1:
			d, m, rest := half(q), float32(0), q[2:]
			if dt == Q5_1 {
				m, rest = half(q[2:]), q[4:]
			}
			qh := binary.LittleEndian.Uint32(rest)
			qs := rest[4:]
			for j := 0; j < 16; j++ {
				lo := int(qs[j]&15) | int(qh>>j&1)<<4
				hi := int(qs[j]>>4) | int(qh>>(j+16)&1)<<4
				if dt == Q5_0 {
					y[j], y[j+16] = d*float32(lo-16), d*float32(hi-16)
				} else {
					y[j], y[j+16] = float32(d*float32(lo))+m, float32(d*float32(hi))+m
				}
			}
		case Q4_K, Q5_K:
			d, dmin, sc := half(q), half(q[2:]), q[4:16]
			var qh, qs []byte
			if dt == Q4_K {
				qs = q[16:]
			} else {
				qh, qs = q[16:48], q[48:]
			}
			for r := 0; r < 4; r++ {
				s1, m1 := scaleMinK(sc, 2*r)
				s2, m2 := scaleMinK(sc, 2*r+1)
				d1, o1 := d*float32(s1), dmin*float32(m1)
				d2, o2 := d*float32(s2), dmin*float32(m2)
				for l := 0; l < 32; l++ {
					lo, hi := int(qs[32*r+l]&15), int(qs[32*r+l]>>4)
					if qh != nil {
						lo |= int(qh[l]>>(2*r)&1) << 4
						hi |= int(qh[l]>>(2*r+1)&1) << 4
					}
					y[64*r+l] = float32(d1*float32(lo)) - o1
					y[64*r+32+l] = float32(d2*float32(hi)) - o2
				}
			}
		case Q6_K:
			d := half(q[208:])
			for h := 0; h < 2; h++ {
				ql, qh, sc := q[64*h:], q[128+32*h:], q[192+8*h:]
				for l := 0; l < 32; l++ {
					is := l / 16
					for k := 0; k < 4; k++ {
						lb := ql[l+32*(k%2)]
						nib := lb & 15
						if k >= 2 {
							nib = lb >> 4
						}
						v := int(nib|(qh[l]>>(2*k)&3)<<4) - 32
						y[128*h+32*k+l] = d * float32(int8(sc[is+2*k])) * float32(v)
					}
				}
			}
		case Q3_K:
			d := half(q[108:])
			hm, qs, sc := q[:32], q[32:96], q[96:108]
			for h := 0; h < 2; h++ {
				for k := 0; k < 4; k++ {
					for l := 0; l < 32; l++ {
						v := int(qs[32*h+l]>>(2*k)&3) - 4
						if hm[l]>>(4*h+k)&1 != 0 {
							v += 4
						}
						g := 8*h + 2*k + l/16
						y[128*h+32*k+l] = d * float32(scaleQ3K(sc, g)-32) * float32(v)
					}
				}
			}
		case Q2_K:
			d, dmin := half(q[80:]), half(q[82:])
			sc, qs := q[:16], q[16:80]
			for h := 0; h < 2; h++ {
				for k := 0; k < 4; k++ {
					for l := 0; l < 32; l++ {
						g := 8*h + 2*k + l/16
						v := int(qs[32*h+l] >> (2 * k) & 3)
						y[128*h+32*k+l] = float32(float32(d*float32(sc[g]&15))*float32(v)) - float32(dmin*float32(sc[g]>>4))
					}
				}
			}
		default:
			panic("kernels: decodeRow of " + dt.String())
		}
	}
}

// encodeRow quantises a row into a ggml block format by rounding to the
// nearest level with scales taken from each block's range: plain, not
// ggml's error-minimising search, and enough to make valid blocks for
// tests and dummy weights. Every element ends within about one quantisation
// step of its value (see TestQuantRoundTrip).
func encodeRow(dt DType, dst []byte, row []float32) {
	in := dtypeInfo[dt]
	for blk := 0; blk < len(row)/in.block; blk++ {
		x := row[blk*in.block : (blk+1)*in.block]
		o := dst[blk*in.bytes : (blk+1)*in.bytes]
		clear(o)
		switch dt {
		case Q4_0, Q5_0:
			levels := 8
			if dt == Q5_0 {
				levels = 16
			}
			d := rhalf(absMax(x) / float32(levels-1))
			binary.LittleEndian.PutUint16(o, F32ToF16(d))
			var q [32]int
			for j, v := range x {
				q[j] = quantLevel(v, d, -levels, levels-1) + levels
			}
			packNibbles(dt, o[2:], q[:])
		case Q4_1, Q5_1:
			top := 15
			if dt == Q5_1 {
				top = 31
			}
			lo, hi := minMax(x)
			d, m := rhalf((hi-lo)/float32(top)), rhalf(lo)
			binary.LittleEndian.PutUint16(o, F32ToF16(d))
			binary.LittleEndian.PutUint16(o[2:], F32ToF16(m))
			var q [32]int
			for j, v := range x {
				q[j] = quantLevel(v-m, d, 0, top)
			}
			packNibbles(dt, o[4:], q[:])
		case Q4_K, Q5_K:
			top := 15
			if dt == Q5_K {
				top = 31
			}
			var scale, mn [8]float32
			var smax, mmax float32
			for j := 0; j < 8; j++ {
				lo, hi := minMax(x[32*j : 32*j+32])
				lo = min(lo, 0)
				scale[j], mn[j] = (hi-lo)/float32(top), -lo
				smax, mmax = max(smax, scale[j]), max(mmax, mn[j])
			}
			d, dmin := rhalf(smax/63), rhalf(mmax/63)
			binary.LittleEndian.PutUint16(o, F32ToF16(d))
			binary.LittleEndian.PutUint16(o[2:], F32ToF16(dmin))
			var sc, ms [8]uint8
			for j := 0; j < 8; j++ {
				if d > 0 {
					sc[j] = uint8(min(63, math.Ceil(float64(scale[j]/d))))
				}
				if dmin > 0 {
					ms[j] = uint8(min(63, math.Ceil(float64(mn[j]/dmin))))
				}
			}
			s := o[4:16]
			for j := 0; j < 4; j++ {
				s[j] = sc[j] | sc[j+4]>>4<<6
				s[j+4] = ms[j] | ms[j+4]>>4<<6
				s[j+8] = sc[j+4]&15 | ms[j+4]&15<<4
			}
			qs := o[16:]
			var qh []byte
			if dt == Q5_K {
				qh, qs = o[16:48], o[48:]
			}
			for j := 0; j < 8; j++ {
				dj, mj := d*float32(sc[j]), dmin*float32(ms[j])
				for l := 0; l < 32; l++ {
					q := quantLevel(x[32*j+l]+mj, dj, 0, top)
					r := j / 2
					if j%2 == 0 {
						qs[32*r+l] |= byte(q & 15)
					} else {
						qs[32*r+l] |= byte(q&15) << 4
					}
					if qh != nil {
						qh[l] |= byte(q>>4&1) << j
					}
				}
			}
		case Q6_K:
			var scale [16]float32
			var smax float32
			for g := 0; g < 16; g++ {
				scale[g] = absMax(x[16*g:16*g+16]) / 31
				smax = max(smax, scale[g])
			}
			d := rhalf(smax / 127)
			binary.LittleEndian.PutUint16(o[208:], F32ToF16(d))
			for g := 0; g < 16; g++ {
				var sc int8
				if d > 0 {
					sc = int8(min(127, math.Ceil(float64(scale[g]/d))))
				}
				o[192+g] = byte(sc)
				step := d * float32(sc)
				for e := 16 * g; e < 16*g+16; e++ {
					q := quantLevel(x[e], step, -32, 31) + 32
					h, k, l := e/128, e%128/32, e%32
					lb := &o[64*h+l+32*(k%2)]
					if k < 2 {
						*lb |= byte(q & 15)
					} else {
						*lb |= byte(q&15) << 4
					}
					o[128+32*h+l] |= byte(q>>4) << (2 * k)
				}
			}
		case Q3_K:
			var scale [16]float32
			var smax float32
			for g := 0; g < 16; g++ {
				scale[g] = absMax(x[16*g:16*g+16]) / 3
				smax = max(smax, scale[g])
			}
			d := rhalf(smax / 31)
			binary.LittleEndian.PutUint16(o[108:], F32ToF16(d))
			sc := o[96:108]
			for g := 0; g < 16; g++ {
				var v int
				if d > 0 {
					v = int(min(31, math.Ceil(float64(scale[g]/d))))
				}
				u := byte(v + 32)
				if g < 8 {
					sc[g] |= u & 15
				} else {
					sc[g%8] |= (u & 15) << 4
				}
				sc[8+g%4] |= (u >> 4) << (2 * (g / 4))
				step := d * float32(v)
				for e := 16 * g; e < 16*g+16; e++ {
					q := quantLevel(x[e], step, -4, 3) + 4
					h, k, l := e/128, e%128/32, e%32
					o[32+32*h+l] |= byte(q&3) << (2 * k)
					o[l] |= byte(q>>2) << (4*h + k)
				}
			}
		case Q2_K:
			var scale, mn [16]float32
			var smax, mmax float32
			for g := 0; g < 16; g++ {
				lo, hi := minMax(x[16*g : 16*g+16])
				lo = min(lo, 0)
				scale[g], mn[g] = (hi-lo)/3, -lo
				smax, mmax = max(smax, scale[g]), max(mmax, mn[g])
			}
			d, dmin := rhalf(smax/15), rhalf(mmax/15)
			binary.LittleEndian.PutUint16(o[80:], F32ToF16(d))
			binary.LittleEndian.PutUint16(o[82:], F32ToF16(dmin))
			for g := 0; g < 16; g++ {
				var sc, m uint8
				if d > 0 {
					sc = uint8(min(15, math.Ceil(float64(scale[g]/d))))
				}
				if dmin > 0 {
					m = uint8(min(15, math.Ceil(float64(mn[g]/dmin))))
				}
				o[g] = sc | m<<4
				step, off := d*float32(sc), dmin*float32(m)
				for e := 16 * g; e < 16*g+16; e++ {
					q := quantLevel(x[e]+off, step, 0, 3)
					h, k, l := e/128, e%128/32, e%32
					o[16+32*h+l] |= byte(q) << (2 * k)
				}
			}
		default:
			panic("kernels: encodeRow to " + dt.String())
		}
	}
}

// rhalf rounds to the nearest IEEE half: scales are stored as halves, so
// quants are chosen against the scale the reader will see.
func rhalf(v float32) float32 { return F16ToF32(F32ToF16(v)) }

func quantLevel(v, step float32, lo, hi int) int {
	if step == 0 {
		return max(lo, min(hi, 0))
	}
	q := int(math.Round(float64(v / step)))
	return max(lo, min(hi, q))
}

func absMax(x []float32) float32 {
	var m float32
	for _, v := range x {
		m = max(m, float32(math.Abs(float64(v))))
	}
	return m
}

func minMax(x []float32) (lo, hi float32) {
	lo, hi = x[0], x[0]
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// packNibbles stores 32 quants of a Q4_0/Q4_1 (16 bytes) or Q5_0/Q5_1
// (4 bytes of high bits, then 16) block.
func packNibbles(dt DType, o []byte, q []int) {
	if dt == Q5_0 || dt == Q5_1 {
		var qh uint32
		for j, v := range q {
			qh |= uint32(v>>4&1) << j
		}
		binary.LittleEndian.PutUint32(o, qh)
		o = o[4:]
	}
	for j := 0; j < 16; j++ {
		o[j] = byte(q[j]&15) | byte(q[j+16]&15)<<4
	}
}
