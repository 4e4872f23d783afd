package cuda

/*
#cgo CFLAGS: -O2 -std=gnu11
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "driver.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

// minDriver is the oldest driver API version the kernels load on (CUDA
// 11.8: nvcc 11.8's PTX and sm_90 SASS).
const minDriver = 11080

// libs says which libraries to try, in order (tests point them at fakes).
type libs struct {
	driver []string
	cublas []string
}

func defaultLibs() libs {
	l := libs{driver: []string{"libcuda.so.1"}}
	names := []string{"libcublas.so.12", "libcublas.so.13", "libcublas.so.11"}
	l.cublas = append(l.cublas, names...)
	// A toolkit outside the loader's path (CUDA's installer does not
	// always register /usr/local/cuda/lib64).
	dirs := []string{"/usr/local/cuda/lib64"}
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if v := os.Getenv(env); v != "" {
			dirs = append([]string{filepath.Join(v, "lib64")}, dirs...)
		}
	}
	for _, d := range dirs {
		for _, n := range names {
			l.cublas = append(l.cublas, filepath.Join(d, n))
		}
	}
	return l
}

// driver is a loaded libcuda: its entry points.
type driver struct {
	c    *C.bk_cuda
	name string
}

var (
	libMu   sync.Mutex
	drivers = map[string]*driver{}      // never unloaded: unloading a driver is not safe
	blases  = map[string]*C.bk_cublas{} // likewise
)

// loadDriver dlopens name once per process.
func loadDriver(name string) (*driver, error) {
	libMu.Lock()
	defer libMu.Unlock()
	if d := drivers[name]; d != nil {
		return d, nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var ebuf [512]C.char
	c := C.bk_cuda_load(cname, &ebuf[0], C.size_t(len(ebuf)))
	if c == nil {
		return nil, errors.New(C.GoString(&ebuf[0]))
	}
	d := &driver{c: c, name: name}
	drivers[name] = d
	return d, nil
}

// loadCUBLAS dlopens a cuBLAS once per process.
func loadCUBLAS(name string) (*C.bk_cublas, error) {
	libMu.Lock()
	defer libMu.Unlock()
	if b := blases[name]; b != nil {
		return b, nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var ebuf [512]C.char
	b := C.bk_cublas_load(cname, &ebuf[0], C.size_t(len(ebuf)))
	if b == nil {
		return nil, errors.New(C.GoString(&ebuf[0]))
	}
	blases[name] = b
	return b, nil
}

func versionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// Well-known CUresult names, for messages when cuGetErrorString cannot help.
var cuResultNames = map[int]string{
	1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
	4: "CUDA_ERROR_DEINITIALIZED", 34: "CUDA_ERROR_STUB_LIBRARY", 35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
	46: "CUDA_ERROR_DEVICES_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
	200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	218: "CUDA_ERROR_INVALID_PTX", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 304: "CUDA_ERROR_OPERATING_SYSTEM",
	500: "CUDA_ERROR_NOT_FOUND", 700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT", 719: "CUDA_ERROR_LAUNCH_FAILED", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 999: "CUDA_ERROR_UNKNOWN",
}

// Result codes the backend reacts to.
const (
	cuErrNoDevice = 100
)

func (d *driver) errText(r C.bk_res) string {
	name := cuResultNames[int(r)]
	if name == "" {
		name = fmt.Sprintf("CUresult %d", int(r))
	}
	if s := C.bk_error_string(d.c, r); s != nil {
		return fmt.Sprintf("%s (%s)", C.GoString(s), name)
	}
	return name
}

// cuError is a failed driver call.
type cuError struct {
	op   string
	code int
	text string
}

func (e *cuError) Error() string { return fmt.Sprintf("cuda: %s: %s", e.op, e.text) }

func (d *driver) check(op string, r C.bk_res) error {
	if r == 0 {
		return nil
	}
	return &cuError{op: op, code: int(r), text: d.errText(r)}
}

var cublasStatus = map[int]string{
	1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
	8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
}

func blasCheck(op string, r C.bk_res) error {
	if r == 0 {
		return nil
	}
	name := cublasStatus[int(r)]
	if name == "" {
		name = fmt.Sprintf("cublasStatus %d", int(r))
	}
	return fmt.Errorf("cuda: %s: %s", op, name)
}

// initDriver loads the first driver library of names that exists, checks
// its version (returned, e.g. 12040 for CUDA 12.4) and runs cuInit. Errors
// name what is missing.
func initDriver(names []string) (*driver, int, error) {
	var d *driver
	var firstErr error
	for _, n := range names {
		var err error
		if d, err = loadDriver(n); err == nil {
			break
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if d == nil {
		return nil, 0, fmt.Errorf("cuda: %v (is the NVIDIA driver installed?)", firstErr)
	}
	var v C.int
	if err := d.check("cuDriverGetVersion", C.bk_driver_version(d.c, &v)); err != nil {
		return nil, 0, err
	}
	if v < minDriver {
		return nil, 0, fmt.Errorf("cuda: driver too old (CUDA %s, need %s)", versionString(int(v)), versionString(minDriver))
	}
	if r := C.bk_init(d.c); r != 0 {
		if r == cuErrNoDevice {
			return nil, 0, fmt.Errorf("cuda: no CUDA device (cuInit: %s)", d.errText(r))
		}
		return nil, 0, fmt.Errorf("cuda: cuInit failed: %s", d.errText(r))
	}
	var n C.int
	if err := d.check("cuDeviceGetCount", C.bk_device_count(d.c, &n)); err != nil {
		return nil, 0, err
	}
	if n == 0 {
		return nil, 0, errors.New("cuda: no CUDA device")
	}
	return d, int(v), nil
}

func (d *driver) deviceCount() int {
	var n C.int
	if C.bk_device_count(d.c, &n) != 0 {
		return 0
	}
	return int(n)
}

// CUdevice_attribute values.
const (
	attrMaxSharedPerBlock = 8
	attrSMs               = 16
	attrCCMajor           = 75
	attrCCMinor           = 76
)

// deviceInfo describes one GPU.
type deviceInfo struct {
	index        int
	dev          C.int
	name         string
	major, minor int
	sms          int
	memory       uint64
}

func (d *driver) device(i int) (deviceInfo, error) {
	info := deviceInfo{index: i}
	if err := d.check("cuDeviceGet", C.bk_device_get(d.c, &info.dev, C.int(i))); err != nil {
		return info, err
	}
	var name [256]C.char
	if err := d.check("cuDeviceGetName", C.bk_device_name(d.c, &name[0], C.int(len(name)), info.dev)); err != nil {
		return info, err
	}
	info.name = C.GoString(&name[0])
	attr := func(a int) int {
		var v C.int
		if C.bk_device_attr(d.c, &v, C.int(a), info.dev) != 0 {
			return 0
		}
		return int(v)
	}
	info.major, info.minor, info.sms = attr(attrCCMajor), attr(attrCCMinor), attr(attrSMs)
	var mem C.size_t
	if C.bk_device_mem(d.c, &mem, info.dev) == 0 {
		info.memory = uint64(mem)
	}
	return info, nil
}

func (i deviceInfo) String() string {
	return fmt.Sprintf("%s (sm_%d%d, %d SMs, %.1f GiB)", i.name, i.major, i.minor, i.sms, float64(i.memory)/(1<<30))
}

// features says which optional parts of the driver API it has: CUDA
// graphs (decode steps replayed, --cuda-graph-max-bs) and CUDA IPC
// (--transport cuda-ipc).
func (d *driver) features() string {
	has := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "no"
	}
	return fmt.Sprintf("graphs %s, ipc %s", has(C.bk_has_graphs(d.c) != 0), has(C.bk_has_ipc(d.c) != 0))
}
