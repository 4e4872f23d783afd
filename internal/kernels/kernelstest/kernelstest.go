// Package kernelstest holds what every backend's parity tests share: random
// weights and activations, and a comparison that reports the worst error
// relative to a stated tolerance.
package kernelstest

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

// RandMatrix makes a rows x cols matrix of dtype dt with normal values (Q8_0:
// random blocks with small scales; the other block formats: normal values
// quantised).
func RandMatrix(rng *rand.Rand, dt kernels.DType, rows, cols int) *kernels.Matrix {
	m := &kernels.Matrix{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, dt.RowBytes(cols)*rows)}
	d := m.Data
	switch dt {
	case kernels.F32:
		for i := 0; i < rows*cols; i++ {
			binary.LittleEndian.PutUint32(d[4*i:], math.Float32bits(float32(rng.NormFloat64())))
		}
	case kernels.F16:
		for i := 0; i < rows*cols; i++ {
			binary.LittleEndian.PutUint16(d[2*i:], kernels.F32ToF16(float32(rng.NormFloat64())))
		}
	case kernels.BF16:
		for i := 0; i < rows*cols; i++ {
			binary.LittleEndian.PutUint16(d[2*i:], uint16(math.Float32bits(float32(rng.NormFloat64()))>>16))
		}
	case kernels.Q8_0:
		for b := 0; b < rows*cols/32; b++ {
			blk := d[34*b:]
			binary.LittleEndian.PutUint16(blk, kernels.F32ToF16(float32(0.001+0.05*rng.Float64())))
			for j := 0; j < 32; j++ {
				blk[2+j] = byte(int8(rng.IntN(255) - 127))
			}
		}
	default: // the ggml block formats: normal values through the quantiser
		row := make([]float32, cols)
		rb := dt.RowBytes(cols)
		for r := 0; r < rows; r++ {
			for i := range row {
				row[i] = float32(rng.NormFloat64())
			}
			kernels.EncodeRow(d[r*rb:(r+1)*rb], row, dt)
		}
	}
	return m
}

// RandVec is n normal values times scale.
func RandVec(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// Checker collects the worst error relative to the magnitude and reports the
// first few elements beyond the tolerance.
type Checker struct {
	T     testing.TB
	What  string
	Tol   float64
	Worst float64
	Fails int
}

// Check compares one element: |got-want| <= Tol*mag + abs, and NaN only
// where NaN is expected.
func (c *Checker) Check(i int, got, want float32, mag, abs float64) {
	d := math.Abs(float64(got) - float64(want))
	if math.IsNaN(float64(got)) != math.IsNaN(float64(want)) || d > c.Tol*mag+abs {
		c.Fails++
		if c.Fails <= 5 {
			c.T.Errorf("%s: element %d: got %g, want %g (diff %g, allowed %g)", c.What, i, got, want, d, c.Tol*mag+abs)
		}
	}
	if mag > 0 && d/mag > c.Worst {
		c.Worst = d / mag
	}
}
