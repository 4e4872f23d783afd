package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// TestQuantRoundTrip: quantising a row and reading it back lands every
// element within about half a quantisation step of its block (plus, for
// the K formats, a step of the quantised minimum) of where it was.
func TestQuantRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range QuantDTypes {
		for _, scale := range []float64{1, 1e-3, 40} {
			const cols = 512
			row := make([]float32, cols)
			for i := range row {
				row[i] = float32(rng.NormFloat64() * scale)
				if i%97 == 5 {
					row[i] += float32(3 * scale) // an outlier in some blocks
				}
			}
			m := &Matrix{DType: dt, Rows: 1, Cols: cols, Data: make([]byte, dt.RowBytes(cols))}
			EncodeRow(m.Data, row, dt)
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, cols)
			m.Row(0, got)
			levels := map[DType]float32{Q4_0: 15, Q4_1: 15, Q5_0: 31, Q5_1: 31, Q4_K: 15, Q5_K: 31, Q6_K: 63, Q3_K: 6, Q2_K: 3}[dt]
			sub := 32
			if dt == Q6_K || dt == Q3_K || dt == Q2_K {
				sub = 16
			}
			var worst float64
			for b := 0; b < cols/sub; b++ {
				lo, hi := minMax(row[b*sub : b*sub+sub])
				if dt == Q4_K || dt == Q5_K || dt == Q2_K {
					lo = min(lo, 0)
				}
				if dt == Q4_0 || dt == Q5_0 || dt == Q6_K || dt == Q3_K {
					a := max(-lo, hi)
					lo, hi = -a, a
				}
				step := (hi - lo) / levels
				// The K formats share one 6-bit-quantised minimum scale per
				// super-block: its rounding moves a block's minimum by up to
				// one step of dmin = (largest minimum)/63.
				var slack float32
				if dt == Q4_K || dt == Q5_K {
					var mmax float32
					sb := b / 8 * 256
					for j := sb; j < sb+256; j += 32 {
						l, _ := minMax(row[j : j+32])
						mmax = max(mmax, -min(l, 0))
					}
					slack = mmax / 63
				}
				// Q3_K's 16 scales are 6-bit multiples of d = (largest
				// scale)/31, rounded up: a block's step grows by up to d.
				if dt == Q3_K {
					var amax float32
					sb := b / 16 * 256
					for j := sb; j < sb+256; j++ {
						amax = max(amax, float32(math.Abs(float64(row[j]))))
					}
					slack = amax / 3 / 31
				}
				// Q2_K's 4-bit scales and mins are multiples of d = (largest
				// scale)/15 and dmin = (largest min)/15, rounded up: a step
				// grows by up to d, and a minimum moves by up to dmin, which
				// the top level may then clip.
				if dt == Q2_K {
					var smax, mmax float32
					sb := b / 16 * 256
					for j := sb; j < sb+256; j += 16 {
						l, hi := minMax(row[j : j+16])
						l = min(l, 0)
						smax, mmax = max(smax, (hi-l)/3), max(mmax, -l)
					}
					slack = smax/15 + 2*mmax/15
				}
				for i := b * sub; i < b*sub+sub; i++ {
					err := math.Abs(float64(got[i] - row[i]))
					bound := float64(step+slack)*0.6 + 1e-6*scale
					worst = max(worst, err/float64(step+slack))
					if err > bound {
						t.Fatalf("%s scale %g element %d: %g came back as %g (block step %g, bound %g)", dt, scale, i, row[i], got[i], step, bound)
					}
				}
			}
			t.Logf("%s scale %g: worst error %.2f steps", dt, scale, worst)
		}
	}
}

// TestQuantLayout decodes blocks built by hand from the format
// descriptions, so a layout misread the same way by the quantiser and the
// decoder still fails.
func TestQuantLayout(t *testing.T) {
	h := func(b []byte, v float32) { binary.LittleEndian.PutUint16(b, F32ToF16(v)) }
	row := func(dt DType, blk []byte) []float32 {
		m := &Matrix{DType: dt, Rows: 1, Cols: dt.BlockSize(), Data: blk}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, m.Cols)
		m.Row(0, y)
		return y
	}
	check := func(what string, got, want float32) {
		t.Helper()
		if got != want {
			t.Errorf("%s: got %g, want %g", what, got, want)
		}
	}

	// Q4_0: d = 0.5; byte 3 = 0xA2: element 3 is (2-8)·0.5, element 19 (10-8)·0.5.
	b := make([]byte, 18)
	h(b, 0.5)
	b[2+3] = 0xA2
	y := row(Q4_0, b)
	check("q4_0[3]", y[3], -3)
	check("q4_0[19]", y[19], 1)
	check("q4_0[0]", y[0], -4)

	// Q5_1: d = 0.25, m = -1; bit 20 of qh set (element 20's fifth bit),
	// byte 4 = 0x3F: element 4 is 15·0.25-1, element 20 (3+16)·0.25-1.
	b = make([]byte, 24)
	h(b, 0.25)
	h(b[2:], -1)
	binary.LittleEndian.PutUint32(b[4:], 1<<20)
	b[8+4] = 0x3F
	y = row(Q5_1, b)
	check("q5_1[4]", y[4], 2.75)
	check("q5_1[20]", y[20], 3.75)

	// Q4_K: d = 2, dmin = 0.5. Sub-block 5's scale is 6 bits: low 4 from
	// byte 4+5 = 9 of the scales (low nibble), top 2 from byte 1's top
	// bits; its min takes byte 9's high nibble and byte 5's top bits.
	// Scale 0b10_0011 = 35, min 0b01_0100 = 20. Element 7 of sub-block 5
	// is the high nibble of qs byte 32·2+7.
	b = make([]byte, 144)
	h(b, 2)
	h(b[2:], 0.5)
	sc := b[4:16]
	sc[9] = 0x4<<4 | 0x3
	sc[1] = 0b10 << 6
	sc[5] = 0b01 << 6
	b[16+64+7] = 0x90
	y = row(Q4_K, b)
	check("q4_k[5*32+7]", y[5*32+7], 2*35*9-0.5*20)
	check("q4_k[4*32+7]", y[4*32+7], 0) // sub-block 4: scale and min 0
	// sub-block 1 (scale byte 1 low 6 bits = 0, min byte 5 low 6 bits = 0)
	check("q4_k[32]", y[32], 0)

	// Q6_K: d = 0.125. Element 200 is in the second half (l = 200-128 = 72
	// → quarter 2, l = 8): low nibble from the high half of ql byte
	// 64+8, high 2 bits from bits 4..5 of qh byte 128+32+8, scale
	// sc[8 + 8/16 + 2·2] = byte 192+12.
	b = make([]byte, 210)
	h(b[208:], 0.125)
	b[64+8] = 0x70
	b[128+32+8] = 0b10 << 4
	b[192+12] = 0xFD // int8 -3
	y = row(Q6_K, b)
	check("q6_k[200]", y[200], 0.125*-3*float32(0x27-32))
	check("q6_k[0]", y[0], 0) // scale 0

	// Q3_K: d = 0.5. Element 200 is half 1, quarter 2, l = 8: low 2 bits
	// from bits 4..5 of quant byte 32·1+8, third bit from bit 4·1+2 = 6 of
	// high byte 8; scale group 8+2·2+0 = 12 takes the high nibble of scale
	// byte 4 and bits 6..7 of scale byte 8: 0b10_0101 = 37, minus 32.
	b = make([]byte, 110)
	h(b[108:], 0.5)
	b[32+40] = 0b11 << 4
	b[8] = 1 << 6
	b[96+4] = 0x5 << 4
	b[96+8] = 0b10 << 6
	y = row(Q3_K, b)
	check("q3_k[200]", y[200], 0.5*5*3)
	check("q3_k[0]", y[0], 0.5*-32*-4) // all zero bits: scale -32, quant -4

	// Q2_K: d = 0.5, dmin = 0.25. Element 148 is half 1, quarter 0, l = 20:
	// bits 0..1 of quant byte 16+32+20, scale pair 8+0+1 = 9 (scale 6,
	// min 3). Element 244 (quarter 3, l = 20) takes bits 6..7 of the same
	// byte and pair 15 (scale 1, min 2).
	b = make([]byte, 84)
	h(b[80:], 0.5)
	h(b[82:], 0.25)
	b[9] = 3<<4 | 6
	b[15] = 2<<4 | 1
	b[16+32+20] = 3<<6 | 2
	y = row(Q2_K, b)
	check("q2_k[148]", y[148], 0.5*6*2-0.25*3)
	check("q2_k[244]", y[244], 0.5*1*3-0.25*2)
	check("q2_k[0]", y[0], 0)
}
