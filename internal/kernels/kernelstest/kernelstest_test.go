package kernelstest

import (
	"math"
	"testing"
)

// The comparison can fail: an error just above the tolerance is reported,
// one just below is not, and an unexpected NaN always is.
func TestCheckerCatchesErrors(t *testing.T) {
	ft := &testing.T{}
	c := &Checker{T: ft, What: "probe", Tol: 1e-6}
	c.Check(0, 1+1.5e-6, 1, 1, 0)
	c.Check(1, float32(math.NaN()), 1, 1, 0)
	if c.Fails != 2 {
		t.Fatalf("checker missed %d of 2 errors", 2-c.Fails)
	}
	c = &Checker{T: ft, What: "probe", Tol: 1e-6}
	c.Check(0, 1+5e-7, 1, 1, 0)
	if c.Fails != 0 {
		t.Fatal("checker flagged an error within tolerance")
	}
}
