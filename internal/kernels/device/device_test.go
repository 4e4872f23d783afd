package device

import (
	"errors"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/kernels/ref"
)

func TestCPU(t *testing.T) {
	b, line, err := Select("cpu", 2)
	if err != nil || b.Name() != "cpu" || !strings.HasPrefix(line, "device cpu: ") || !strings.Contains(line, "2 threads") {
		t.Fatalf("cpu: %v %q %v", b, line, err)
	}
}

// TestHere: on this machine, auto falls back to the CPU exactly when cuda
// fails, and cuda fails with the reason.
func TestHere(t *testing.T) {
	_, perr := cuda.Probe()
	b, line, err := Select("auto", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(line)
	if perr != nil {
		if b.Name() != "cpu" || !strings.Contains(line, "device auto: cpu (cuda: ") {
			t.Fatalf("auto without a GPU: %s %q", b.Name(), line)
		}
		_, _, err := Select("cuda", 1)
		if err == nil || !strings.Contains(err.Error(), "device cuda unavailable: cuda: ") {
			t.Fatalf("cuda without a GPU: %v", err)
		}
		t.Log(err)
		return
	}
	if b.Name() != "cuda" {
		t.Fatalf("auto with a GPU (%s) chose %s", perr, b.Name())
	}
}

func TestSelectCUDA(t *testing.T) {
	defer func(f func(int) (kernels.Backend, string, error)) { openCUDA = f }(openCUDA)
	var opened []int
	openCUDA = func(i int) (kernels.Backend, string, error) {
		opened = append(opened, i)
		if i > 1 {
			return nil, "", errors.New("cuda: no CUDA device 2 (2 present)")
		}
		return ref.New(), "stand-in GPU", nil
	}
	if b, line, err := Select("auto", 1); err != nil || b.Name() != "ref" || line != "device auto: cuda:0: stand-in GPU" {
		t.Fatalf("auto with a GPU: %v %q %v", b, line, err)
	}
	if _, line, err := Select(" CUDA:1 ", 1); err != nil || line != "device cuda:1: stand-in GPU" {
		t.Fatalf("cuda:1: %q %v", line, err)
	}
	if _, _, err := Select("cuda:2", 1); err == nil || !strings.Contains(err.Error(), "no CUDA device 2") {
		t.Fatalf("cuda:2: %v", err)
	}
	if _, _, err := Select("", 1); err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 2, 0}; len(opened) != len(want) {
		t.Fatalf("opened %v, want %v", opened, want)
	}
	for _, bad := range []string{"gpu", "cuda:", "cuda:-1", "cuda:x", "cpu2"} {
		if _, _, err := Select(bad, 1); err == nil {
			t.Errorf("Select(%q) succeeded", bad)
		}
	}
}
