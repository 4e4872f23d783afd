// Package device picks the kernel backend a process runs on (--device).
package device

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/cuda"
)

// openCUDA opens GPU index (tests replace it).
var openCUDA = func(index int) (kernels.Backend, string, error) {
	b, err := cuda.Open(index)
	if err != nil {
		return nil, "", err
	}
	return b, b.Describe(), nil
}

// Select returns the backend for device and a line to log:
//
//	cpu     the CPU backend with threads threads (<= 0: all cores)
//	cuda    GPU 0; an error saying why when there is no usable GPU
//	cuda:N  GPU N
//	auto    GPU 0 when usable, else the CPU (the line says why); "" is auto
//
// A CUDA backend also implements io.Closer (it frees device memory).
func Select(device string, threads int) (kernels.Backend, string, error) {
	d := strings.ToLower(strings.TrimSpace(device))
	switch {
	case d == "cpu":
		b := cpu.New(threads)
		return b, "device cpu: " + b.Features(), nil
	case d == "cuda" || strings.HasPrefix(d, "cuda:"):
		index := 0
		if s, ok := strings.CutPrefix(d, "cuda:"); ok {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return nil, "", fmt.Errorf("device %q: want cuda:N with N a GPU index", device)
			}
			index = n
		}
		b, desc, err := openCUDA(index)
		if err != nil {
			return nil, "", fmt.Errorf("device %s unavailable: %w", d, err)
		}
		return b, fmt.Sprintf("device cuda:%d: %s", index, desc), nil
	case d == "auto" || d == "":
		b, desc, err := openCUDA(0)
		if err == nil {
			return b, "device auto: cuda:0: " + desc, nil
		}
		c := cpu.New(threads)
		return c, fmt.Sprintf("device auto: cpu (%v): %s", err, c.Features()), nil
	}
	return nil, "", fmt.Errorf("unknown device %q (cpu, cuda, cuda:N or auto)", device)
}
