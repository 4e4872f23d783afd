package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// e4m3Value is the definition of an e4m3 code, written from the format
// (not from E4M3ToF32's trick): (-1)^s · 2^(e-7) · (1 + m/8), or
// 2^-6 · m/8 for e = 0.
func e4m3Value(u uint8) float64 {
	s, e, m := u>>7, int(u>>3&15), float64(u&7)
	v := math.Ldexp(1+m/8, e-7)
	if e == 0 {
		v = math.Ldexp(m/8, -6)
	}
	if s == 1 {
		v = -v
	}
	return v
}

func TestE4M3Decode(t *testing.T) {
	for c := 0; c < 256; c++ {
		u := uint8(c)
		got := E4M3ToF32(u)
		if u&0x7f == 0x7f {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("code %#02x decodes to %v, want NaN", u, got)
			}
			continue
		}
		if want := e4m3Value(u); float64(got) != want || math.Signbit(float64(got)) != (u&0x80 != 0) {
			t.Fatalf("code %#02x decodes to %v, want %v", u, got, want)
		}
		if back := F32ToE4M3(got); back != u {
			t.Fatalf("code %#02x: %v encodes back to %#02x", u, got, back)
		}
	}
	if e4m3Value(0x7e) != e4m3Max {
		t.Fatalf("largest code is %v, want %v", e4m3Value(0x7e), e4m3Max)
	}
}

// nearestE4M3 finds the code closest to f by search over every finite
// code, a tie going to the even code, a magnitude past 448 to ±448.
func nearestE4M3(f float32) uint8 {
	if math.Abs(float64(f)) > e4m3Max {
		f = float32(math.Copysign(e4m3Max, float64(f)))
	}
	best, bestD := uint8(0), math.Inf(1)
	for c := 0; c < 256; c++ {
		u := uint8(c)
		if u&0x7f == 0x7f || (u&0x80 != 0) != math.Signbit(float64(f)) {
			continue
		}
		d := math.Abs(e4m3Value(u) - float64(f))
		if d < bestD || d == bestD && u&1 == 0 {
			best, bestD = u, d
		}
	}
	return best
}

func TestE4M3Encode(t *testing.T) {
	cases := []float32{0, 1, -1, 448, -448, 449, 464, 1e6, float32(math.Inf(1)), float32(math.Inf(-1)),
		0x1p-9, 0x1p-10, 0x3p-11, 0x1p-6, 0x1.1p-6, 0x1.3p-6, 1.0625, 1.1875, 1.125, 240, 232, 1e-30, 0x1.fp-7}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		cases = append(cases, float32(math.Ldexp(rng.Float64()*2-1, rng.IntN(22)-12)))
	}
	// Every midpoint between neighbouring codes: the ties.
	for c := 0; c < 0x7e; c++ {
		lo, hi := e4m3Value(uint8(c)), e4m3Value(uint8(c+1))
		cases = append(cases, float32((lo+hi)/2), -float32((lo+hi)/2))
	}
	for _, f := range cases {
		got, want := F32ToE4M3(f), nearestE4M3(f)
		if got != want {
			t.Fatalf("F32ToE4M3(%v) = %#02x (%v), want %#02x (%v)", f, got, E4M3ToF32(got), want, e4m3Value(want))
		}
	}
	if u := F32ToE4M3(float32(math.NaN())); u&0x7f != 0x7f {
		t.Fatalf("NaN encodes to %#02x", u)
	}
}

func TestKVNaNPoisonsEveryDType(t *testing.T) {
	for _, dt := range []DType{F32, F16, BF16, F8E4M3} {
		kv := PagedKV{Data: []float32{KVNaN, KVNaN}, PageSize: 1, Layers: 1, KVHeads: 1, HeadDim: 8 / PagedKV{DType: dt}.ElemBytes() / 2, DType: dt}
		row := make([]float32, kv.PageElems())
		kv.LoadRow(0, row)
		for i, v := range row {
			if !math.IsNaN(float64(v)) {
				t.Fatalf("%s: element %d of a poisoned pool reads %v", dt, i, v)
			}
		}
	}
}
