//go:build ucx

package ucx

/*
#include "bt.h"
*/
import "C"

import (
	"strings"
	"unsafe"
)

// Transports lists the UCX transport resources of this host through the
// UCT API (uct_query_components, uct_md_query_tl_resources): every
// transport on every device, with its device type, and Selected set for
// those a UCP context made with the same options would use (UCX_TLS,
// UCX_NET_DEVICES, WithRDMADevices), from ucp_context_print_info. On a
// host without RDMA hardware no resource has Type "net" other than tcp;
// Describe says so plainly.
func Transports(opts ...Option) ([]Resource, error) {
	cfg := newConfig(opts)
	ctx, err := newContext(cfg)
	if err != nil {
		return nil, err
	}
	selected := map[string]bool{}
	for _, r := range ctx.resources() {
		selected[r] = true
	}
	ctx.unref()
	p := C.bt_uct_resources()
	if p == nil {
		return nil, nil
	}
	defer C.free(unsafe.Pointer(p))
	var out []Resource
	seen := map[string]bool{}
	for _, line := range strings.Split(C.GoString(p), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		r := Resource{Transport: f[0], Device: f[1], Type: f[2]}
		if seen[r.String()] {
			continue
		}
		seen[r.String()] = true
		r.Selected = selected[r.String()]
		out = append(out, r)
	}
	return out, nil
}

// CUDAMemory says whether a UCX context made with these options can
// register and move GPU memory (ucp_context_query's memory types include
// CUDA): the UCX build must have CUDA support and find the CUDA driver.
// Detected, never assumed: Debian's libucx answers false.
func CUDAMemory(opts ...Option) (bool, error) {
	cfg := newConfig(opts)
	ctx, err := newContext(cfg)
	if err != nil {
		return false, err
	}
	defer ctx.unref()
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	return C.bt_ctx_cuda_memory(ctx.h) != 0, nil
}
