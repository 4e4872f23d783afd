package cuda

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
)

// TestFakeResident: kept buffers stay on the device between calls; the
// host sees a result only after Host, and the device sees a host write
// only after Changed.
func TestFakeResident(t *testing.T) {
	b := fakeBackend(t)
	rng := rand.New(rand.NewPCG(41, 42))
	w := randMatrix(rng, kernels.F32, 24, 32)
	x := randVec(rng, 3*32, 1)
	y := make([]float32, 3*24)
	z := make([]float32, 3*24)
	b.Keep(x, y)
	want := make([]float32, len(y))
	ref.New().MatMul(want, x, 3, w)

	b.MatMul(y, x, 3, w)
	if slices.ContainsFunc(y, func(f float32) bool { return f != 0 }) {
		t.Fatal("a kept result reached the host without Host")
	}
	// A kept input is read where the result is: z = y + y on the device.
	b.Add(z, y, y)
	b.Host(y)
	for i := range want {
		if d := y[i] - want[i]; d > 1e-4 || d < -1e-4 {
			t.Fatalf("after Host: y[%d] = %g, want %g", i, y[i], want[i])
		}
		if z[i] != 2*y[i] {
			t.Fatalf("z[%d] = %g, want 2*%g (z is not kept: it comes back at once)", i, z[i], y[i])
		}
	}

	// A host write the device does not know about is not seen...
	x0 := append([]float32(nil), x...)
	for i := range x {
		x[i] = -x[i]
	}
	b.MatMul(y, x, 3, w)
	b.Host(y)
	for i := range want {
		if d := y[i] - want[i]; d > 1e-4 || d < -1e-4 {
			t.Fatalf("without Changed the device copy of x should still be the old one: y[%d] = %g, want %g", i, y[i], want[i])
		}
	}
	// ...until Changed.
	b.Changed(x)
	b.MatMul(y, x, 3, w)
	b.Host(y)
	for i := range want {
		if d := y[i] + want[i]; d > 1e-4 || d < -1e-4 {
			t.Fatalf("after Changed: y[%d] = %g, want %g", i, y[i], -want[i])
		}
	}
	copy(x, x0)
	b.Changed(x)

	// A slice that starts inside a kept buffer is refused.
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "into a kept activation buffer") {
				t.Errorf("a view into a kept buffer: recovered %v", r)
			}
		}()
		b.RMSNorm(z[:32], x[32:64], make([]float32, 32), 1, 1e-5)
	}()
	// A prefix view starts the buffer: it is the buffer.
	b.RMSNorm(y[:24], y[:24], slicesRepeat(1, 24), 1, 1e-5)
	b.Host(y)
	if y[0] == want[0] {
		t.Fatal("RMSNorm in place on a kept prefix did not write the buffer")
	}
}

// TestFakeResidentAttention: attention over kept q and out, with the rows
// in the model's order (all on the device) and out of order (gathered and
// scattered on the host).
func TestFakeResidentAttention(t *testing.T) {
	b := fakeBackend(t)
	rng := rand.New(rand.NewPCG(43, 44))
	for _, c := range []kernelstest.AttnCase{
		kernelstest.NewAttnCase(rng, 4, 2, 16, 4, [][2]int{{1, 9}, {3, 7}}).InOrder(),
		kernelstest.NewAttnCase(rng, 4, 2, 16, 4, [][2]int{{1, 9}, {3, 7}}),
	} {
		want := make([]float32, len(c.Q))
		ref.New().Attention(want, c.Q, c.KV, 1, c.Seqs, c.Heads, 0.25)
		got := make([]float32, len(c.Q))
		b.Keep(c.Q, got)
		b.Attention(got, c.Q, toDevice(t, b, c.KV), 1, c.Seqs, c.Heads, 0.25)
		b.Host(got)
		for i := range want {
			if d := got[i] - want[i]; d > 1e-5 || d < -1e-5 {
				t.Fatalf("element %d: %g, want %g", i, got[i], want[i])
			}
		}
	}
}

func slicesRepeat(v float32, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// TestFakeResidentFreed: a kept buffer's device copy goes once its host
// slice is garbage collected.
func TestFakeResidentFreed(t *testing.T) {
	b := fakeBackend(t)
	func() {
		for range 4 {
			b.Keep(make([]float32, 64))
		}
	}()
	if len(b.kept) != 4 {
		t.Fatalf("%d buffers kept, want 4", len(b.kept))
	}
	for i := 0; i < 20 && len(b.kept) > 0; i++ {
		runtime.GC()
		runtime.Gosched()
		b.Add(make([]float32, 1), []float32{1}, []float32{1}) // frees what cleanups queued
	}
	if len(b.kept) != 0 {
		t.Fatalf("after GC: %d kept buffers still on the device", len(b.kept))
	}
}

// TestFakeResidentForeignMemory: with buffers kept, slices of memory Go does
// not own (a mapping) still work as plain arguments.
func TestFakeResidentForeignMemory(t *testing.T) {
	b := fakeBackend(t)
	out := make([]float32, 64)
	b.Keep(out)
	m, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	w := unsafe.Slice((*float32)(unsafe.Pointer(&m[0])), 64)
	for i := range w {
		w[i] = 2
	}
	for i := range out {
		out[i] = 1
	}
	b.Changed(out)
	b.RMSNorm(out, out, w, 1, 0)
	b.Host(out)
	if out[0] != 2 || out[63] != 2 {
		t.Fatalf("RMSNorm of ones by a mapped weight of twos: %g %g", out[0], out[63])
	}
}

// TestFakeResidentForget: Forget frees a kept buffer's device copy at once.
func TestFakeResidentForget(t *testing.T) {
	b := fakeBackend(t)
	x, y := make([]float32, 32), make([]float32, 32)
	b.Keep(x, y)
	b.Forget(x)
	if len(b.kept) != 1 {
		t.Fatalf("%d buffers kept after forgetting one of two", len(b.kept))
	}
	// x is a plain slice again: results come back at once.
	a := make([]float32, 32)
	a[1] = 3
	b.Add(x, a, make([]float32, 32))
	if x[1] != 3 {
		t.Fatal("a forgotten buffer still held its result on the device")
	}
	runtime.KeepAlive(y)
}

// Host copies what the device wrote since the host copy was current (the
// longest result since), not the whole capacity: a buffer sized for a
// larger step keeps its host tail, and of results of 4, 16 and 4 floats
// before one Host all 16 come back.
func TestFakeResidentHostCopiesWhatWasWritten(t *testing.T) {
	b := fakeBackend(t)
	buf := make([]float32, 64)
	for i := range buf {
		buf[i] = 7
	}
	ones := make([]float32, 32)
	for i := range ones {
		ones[i] = 1
	}
	b.Keep(buf)
	b.Add(buf[:8], ones[:8], ones[:8]) // 2 in the first 8 on the device
	b.Host(buf)
	for i, v := range buf {
		if want := map[bool]float32{true: 2, false: 7}[i < 8]; v != want {
			t.Fatalf("after an 8-float result: buf[%d] = %v, want %v", i, v, want)
		}
	}
	b.Add(buf[:4], ones[:4], ones[:4])
	b.Add(buf[:16], ones[:16], ones[:16]) // 2 again: the host must see all 16
	b.Add(buf[:4], buf[:4], ones[:4])     // then 3 in the first 4
	b.Host(buf)
	for i, v := range buf {
		want := float32(7)
		switch {
		case i < 4:
			want = 3
		case i < 16:
			want = 2
		}
		if v != want {
			t.Fatalf("after results of 4, 16 and 4 floats: buf[%d] = %v, want %v", i, v, want)
		}
	}
}
