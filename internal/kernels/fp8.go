package kernels

import "math"

// F8E4M3 KV elements are OCP fp8 e4m3 ("fn": no infinities): a sign,
// four exponent bits of bias 7 and three mantissa bits. The largest
// magnitude is 448; S.1111.111 is NaN; exponent 0 holds the subnormals,
// steps of 2^-9. Values are stored unscaled (a per-tensor scale of 1, what
// vLLM uses when a checkpoint carries no KV scales): K and V of the
// models served stay far inside ±448, and the three mantissa bits, not
// the range, are what fp8 gives up.

// e4m3Max is the largest finite e4m3 magnitude, 1.75·2^8.
const e4m3Max = 448

// F32ToE4M3 converts f to e4m3, rounding to nearest even and saturating:
// a magnitude past 448 (infinities included) becomes ±448, as the
// hardware's satfinite conversion does; a NaN stays a NaN.
func F32ToE4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return sign | 0x7f
	case a >= math.Float32bits(e4m3Max):
		return sign | 0x7e
	case a < 0x3c800000: // below 2^-6: a subnormal, in steps of 2^-9 (exact in float32)
		return sign | uint8(math.RoundToEven(float64(math.Float32frombits(a))*512))
	}
	e := a>>23 - 127 + 7 // 1..15
	r := e<<3 | a>>20&7
	rem := a & 0xfffff
	if rem > 0x80000 || rem == 0x80000 && r&1 == 1 {
		r++ // may carry into the exponent, never past 448 (capped above)
	}
	return sign | uint8(r)
}

// E4M3ToF32 is the value of an e4m3 element: exact, NaN for S.1111.111.
func E4M3ToF32(u uint8) float32 {
	if u&0x7f == 0x7f {
		return float32(math.NaN())
	}
	// Its bits shifted into an IEEE half's place give the same mantissa
	// and the exponent less 8 (biases 7 and 15); subnormals land on the
	// half's subnormals, so one multiply by 2^8 restores the value.
	return F16ToF32(uint16(u&0x80)<<8|uint16(u&0x7f)<<7) * 256
}
