// driver.h: the CUDA driver API and cuBLAS entry points the backend uses,
// as hand-written prototypes (no CUDA headers), reached through dlopen and
// dlsym at run time. Handles travel to Go as uintptr_t.
#ifndef BK_CUDA_DRIVER_H
#define BK_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int bk_res;                 // CUresult / cublasStatus_t
typedef unsigned long long bk_dptr;  // CUdeviceptr (64-bit)
typedef void* bk_h;                  // CUcontext, CUmodule, CUfunction, CUstream, CUevent, cublasHandle_t

// CUDA IPC: CUipcMemHandle, which cuIpcOpenMemHandle takes by value.
typedef struct {
  char reserved[64];
} bk_ipc_handle;

// Returned by a wrapper whose entry point the library lacks (optional ones).
#define BK_ERR_MISSING (-1000)

typedef struct bk_cuda {
  void* lib;
  bk_res (*cuDriverGetVersion)(int*);
  bk_res (*cuInit)(unsigned);
  bk_res (*cuDeviceGetCount)(int*);
  bk_res (*cuDeviceGet)(int*, int);
  bk_res (*cuDeviceGetAttribute)(int*, int, int);
  bk_res (*cuDeviceGetName)(char*, int, int);
  bk_res (*cuDeviceTotalMem)(size_t*, int);
  bk_res (*cuMemGetInfo)(size_t*, size_t*);
  bk_res (*cuDevicePrimaryCtxRetain)(bk_h*, int);
  bk_res (*cuDevicePrimaryCtxRelease)(int);
  bk_res (*cuCtxCreate)(bk_h*, unsigned, int);  // fallback when the primary context calls are missing
  bk_res (*cuCtxDestroy)(bk_h);
  bk_res (*cuCtxSetCurrent)(bk_h);
  bk_res (*cuModuleLoadData)(bk_h*, const void*);
  bk_res (*cuModuleUnload)(bk_h);
  bk_res (*cuModuleGetFunction)(bk_h*, bk_h, const char*);
  bk_res (*cuMemAlloc)(bk_dptr*, size_t);
  bk_res (*cuMemFree)(bk_dptr);
  bk_res (*cuMemcpyHtoD)(bk_dptr, const void*, size_t);
  bk_res (*cuMemcpyDtoH)(void*, bk_dptr, size_t);
  bk_res (*cuMemcpyDtoD)(bk_dptr, bk_dptr, size_t);
  bk_res (*cuMemcpyHtoDAsync)(bk_dptr, const void*, size_t, bk_h);
  bk_res (*cuMemcpyDtoHAsync)(void*, bk_dptr, size_t, bk_h);
  bk_res (*cuMemcpyDtoDAsync)(bk_dptr, bk_dptr, size_t, bk_h);
  bk_res (*cuMemsetD32Async)(bk_dptr, unsigned, size_t, bk_h);
  bk_res (*cuLaunchKernel)(bk_h, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, bk_h, void**,
                           void**);
  bk_res (*cuStreamCreate)(bk_h*, unsigned);
  bk_res (*cuStreamDestroy)(bk_h);
  bk_res (*cuStreamSynchronize)(bk_h);
  bk_res (*cuEventCreate)(bk_h*, unsigned);
  bk_res (*cuEventDestroy)(bk_h);
  bk_res (*cuEventRecord)(bk_h, bk_h);
  bk_res (*cuStreamWaitEvent)(bk_h, bk_h, unsigned);
  bk_res (*cuEventSynchronize)(bk_h);
  bk_res (*cuEventElapsedTime)(float*, bk_h, bk_h);
  bk_res (*cuGetErrorString)(bk_res, const char**);
  // Optional: resolved when present (pinned staging falls back to pageable memory).
  bk_res (*cuMemHostRegister)(void*, size_t, unsigned);
  bk_res (*cuMemHostUnregister)(void*);
  bk_res (*cuMemHostAlloc)(void**, size_t, unsigned);
  bk_res (*cuMemFreeHost)(void*);
  // CUDA IPC
  // Optional too: a driver without them loads, and exporting or mapping
  // an arena says this driver has no CUDA IPC.
  bk_res (*cuIpcGetMemHandle)(bk_ipc_handle*, bk_dptr);
  bk_res (*cuIpcOpenMemHandle)(bk_dptr*, bk_ipc_handle, unsigned);
  bk_res (*cuIpcCloseMemHandle)(bk_dptr);
  bk_res (*cuMemGetAddressRange)(bk_dptr*, size_t*, bk_dptr);
  // CUDA graphs. Optional: without them every step launches directly.
  bk_res (*cuStreamBeginCapture)(bk_h, int);
  bk_res (*cuStreamEndCapture)(bk_h, bk_h*);
  bk_res (*cuGraphInstantiateWithFlags)(bk_h*, bk_h, unsigned long long);
  bk_res (*cuGraphLaunch)(bk_h, bk_h);
  bk_res (*cuGraphExecDestroy)(bk_h);
  bk_res (*cuGraphDestroy)(bk_h);
  // Only the emulated driver (testdata/fakecuda) has it: its device
  // memory is this process's host memory.
  int (*hostVisibleMemory)(void);
} bk_cuda;

typedef struct bk_cublas {
  void* lib;
  bk_res (*create)(bk_h*);
  bk_res (*destroy)(bk_h);
  bk_res (*setStream)(bk_h, bk_h);
  bk_res (*getVersion)(bk_h, int*);
  bk_res (*sgemm)(bk_h, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*,
                  float*, int);
  bk_res (*gemmEx)(bk_h, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                   const void*, void*, int, int, int, int);
  // Optional: without it no graph step holds a cuBLAS product.
  bk_res (*setWorkspace)(bk_h, void*, size_t);
} bk_cublas;

// Loading: NULL and a message in err (naming the library or the missing
// entry point) on failure.
bk_cuda* bk_cuda_load(const char* name, char* err, size_t errlen);
bk_cublas* bk_cublas_load(const char* name, char* err, size_t errlen);

// Thin wrappers (cgo cannot call through function pointers).
static inline int bk_host_visible(bk_cuda* d) { return d->hostVisibleMemory && d->hostVisibleMemory(); }
static inline bk_res bk_driver_version(bk_cuda* d, int* v) { return d->cuDriverGetVersion(v); }
static inline bk_res bk_init(bk_cuda* d) { return d->cuInit(0); }
static inline bk_res bk_device_count(bk_cuda* d, int* n) { return d->cuDeviceGetCount(n); }
static inline bk_res bk_device_get(bk_cuda* d, int* dev, int i) { return d->cuDeviceGet(dev, i); }
static inline bk_res bk_device_attr(bk_cuda* d, int* v, int attr, int dev) { return d->cuDeviceGetAttribute(v, attr, dev); }
static inline bk_res bk_device_name(bk_cuda* d, char* name, int len, int dev) { return d->cuDeviceGetName(name, len, dev); }
static inline bk_res bk_device_mem(bk_cuda* d, size_t* b, int dev) { return d->cuDeviceTotalMem(b, dev); }
static inline bk_res bk_mem_info(bk_cuda* d, size_t* f, size_t* t) { return d->cuMemGetInfo(f, t); }
// bk_ctx_create takes the device's primary context (the one the CUDA
// runtime inside cuBLAS also uses), or creates a context with cuCtxCreate_v2
// where the driver lacks the primary-context calls; *primary says which.
static inline bk_res bk_ctx_create(bk_cuda* d, uintptr_t* ctx, int dev, int* primary) {
  bk_h h = 0;
  bk_res r;
  *primary = d->cuDevicePrimaryCtxRetain && d->cuDevicePrimaryCtxRelease;
  if (*primary) {
    r = d->cuDevicePrimaryCtxRetain(&h, dev);
  } else if (d->cuCtxCreate) {
    r = d->cuCtxCreate(&h, 0, dev);
  } else {
    return BK_ERR_MISSING;
  }
  *ctx = (uintptr_t)h;
  return r;
}
static inline bk_res bk_ctx_destroy(bk_cuda* d, uintptr_t ctx, int dev, int primary) {
  if (primary) return d->cuDevicePrimaryCtxRelease(dev);
  return d->cuCtxDestroy((bk_h)ctx);
}
static inline bk_res bk_ctx_set(bk_cuda* d, uintptr_t ctx) { return d->cuCtxSetCurrent((bk_h)ctx); }
static inline bk_res bk_module_load(bk_cuda* d, uintptr_t* mod, const void* image) {
  bk_h h = 0;
  bk_res r = d->cuModuleLoadData(&h, image);
  *mod = (uintptr_t)h;
  return r;
}
static inline bk_res bk_module_unload(bk_cuda* d, uintptr_t mod) { return d->cuModuleUnload((bk_h)mod); }
static inline bk_res bk_module_function(bk_cuda* d, uintptr_t* fn, uintptr_t mod, const char* name) {
  bk_h h = 0;
  bk_res r = d->cuModuleGetFunction(&h, (bk_h)mod, name);
  *fn = (uintptr_t)h;
  return r;
}
static inline bk_res bk_mem_alloc(bk_cuda* d, bk_dptr* p, size_t n) { return d->cuMemAlloc(p, n); }
static inline bk_res bk_mem_free(bk_cuda* d, bk_dptr p) { return d->cuMemFree(p); }
static inline bk_res bk_htod(bk_cuda* d, bk_dptr dst, const void* src, size_t n, uintptr_t s) {
  return d->cuMemcpyHtoDAsync(dst, src, n, (bk_h)s);
}
static inline bk_res bk_dtoh(bk_cuda* d, void* dst, bk_dptr src, size_t n, uintptr_t s) {
  return d->cuMemcpyDtoHAsync(dst, src, n, (bk_h)s);
}
static inline bk_res bk_dtod(bk_cuda* d, bk_dptr dst, bk_dptr src, size_t n, uintptr_t s) {
  return d->cuMemcpyDtoDAsync(dst, src, n, (bk_h)s);
}
static inline bk_res bk_memset32(bk_cuda* d, bk_dptr dst, unsigned v, size_t n, uintptr_t s) {
  return d->cuMemsetD32Async(dst, v, n, (bk_h)s);
}
static inline bk_res bk_stream_create(bk_cuda* d, uintptr_t* s) {
  bk_h h = 0;
  bk_res r = d->cuStreamCreate(&h, 1 /* CU_STREAM_NON_BLOCKING */);
  *s = (uintptr_t)h;
  return r;
}
static inline bk_res bk_stream_destroy(bk_cuda* d, uintptr_t s) { return d->cuStreamDestroy((bk_h)s); }
static inline bk_res bk_stream_sync(bk_cuda* d, uintptr_t s) { return d->cuStreamSynchronize((bk_h)s); }
// flags: 0, or 2 (CU_EVENT_DISABLE_TIMING) for an event only used to order streams.
static inline bk_res bk_event_create(bk_cuda* d, uintptr_t* e, unsigned flags) {
  bk_h h = 0;
  bk_res r = d->cuEventCreate(&h, flags);
  *e = (uintptr_t)h;
  return r;
}
static inline bk_res bk_event_destroy(bk_cuda* d, uintptr_t e) { return d->cuEventDestroy((bk_h)e); }
static inline bk_res bk_event_record(bk_cuda* d, uintptr_t e, uintptr_t s) { return d->cuEventRecord((bk_h)e, (bk_h)s); }
static inline bk_res bk_stream_wait(bk_cuda* d, uintptr_t s, uintptr_t e) {
  return d->cuStreamWaitEvent((bk_h)s, (bk_h)e, 0);
}
static inline bk_res bk_host_alloc(bk_cuda* d, void** p, size_t n) {
  if (!d->cuMemHostAlloc || !d->cuMemFreeHost) return BK_ERR_MISSING;
  return d->cuMemHostAlloc(p, n, 0);
}
static inline bk_res bk_host_free(bk_cuda* d, void* p) { return d->cuMemFreeHost(p); }
static inline bk_res bk_event_sync(bk_cuda* d, uintptr_t e) { return d->cuEventSynchronize((bk_h)e); }
static inline bk_res bk_event_elapsed(bk_cuda* d, float* ms, uintptr_t a, uintptr_t b) {
  return d->cuEventElapsedTime(ms, (bk_h)a, (bk_h)b);
}
static inline const char* bk_error_string(bk_cuda* d, bk_res r) {
  const char* s = 0;
  if (d->cuGetErrorString(r, &s) != 0) return 0;
  return s;
}

// bk_launch launches fn with nargs arguments, each in an 8-byte slot of
// args (the kernel reads as many bytes as its parameter has; little-endian).
static inline bk_res bk_launch(bk_cuda* d, uintptr_t fn, unsigned gx, unsigned gy, unsigned bx, unsigned smem,
                               uintptr_t stream, uint64_t* args, int nargs) {
  void* params[24];
  if (nargs > 24) return 1;
  for (int i = 0; i < nargs; i++) params[i] = &args[i];
  return d->cuLaunchKernel((bk_h)fn, gx, gy, 1, bx, 1, 1, smem, (bk_h)stream, params, 0);
}

static inline bk_res bk_blas_create(bk_cublas* b, uintptr_t* h) {
  bk_h x = 0;
  bk_res r = b->create(&x);
  *h = (uintptr_t)x;
  return r;
}
static inline bk_res bk_blas_destroy(bk_cublas* b, uintptr_t h) { return b->destroy((bk_h)h); }
static inline bk_res bk_blas_set_stream(bk_cublas* b, uintptr_t h, uintptr_t s) { return b->setStream((bk_h)h, (bk_h)s); }
static inline bk_res bk_blas_version(bk_cublas* b, uintptr_t h, int* v) {
  if (!b->getVersion) return BK_ERR_MISSING;
  return b->getVersion((bk_h)h, v);
}
static inline int bk_blas_has_workspace(bk_cublas* b) { return b->setWorkspace != 0; }
static inline bk_res bk_blas_set_workspace(bk_cublas* b, uintptr_t h, bk_dptr p, size_t n) {
  if (!b->setWorkspace) return BK_ERR_MISSING;
  return b->setWorkspace((bk_h)h, (void*)p, n);
}
// out(m x n, col-major, ldc) = alpha A(k x m, col-major, lda)ᵀ · B(k x n, col-major, ldb) + beta out.
static inline bk_res bk_sgemm_tn(bk_cublas* b, uintptr_t h, int m, int n, int k, float alpha, bk_dptr A, int lda,
                                 bk_dptr B, int ldb, float beta, bk_dptr C, int ldc) {
  return b->sgemm((bk_h)h, 1 /* CUBLAS_OP_T */, 0 /* CUBLAS_OP_N */, m, n, k, &alpha, (const float*)A, lda,
                  (const float*)B, ldb, &beta, (float*)C, ldc);
}
// The same with A and B of type abtype (CUDA_R_16F 2, CUDA_R_16BF 14),
// float32 output and CUBLAS_COMPUTE_32F.
static inline bk_res bk_gemmex_tn(bk_cublas* b, uintptr_t h, int m, int n, int k, float alpha, bk_dptr A, int abtype,
                                  int lda, bk_dptr B, int ldb, float beta, bk_dptr C, int ldc) {
  return b->gemmEx((bk_h)h, 1, 0, m, n, k, &alpha, (const void*)A, abtype, lda, (const void*)B, abtype, ldb, &beta,
                   (void*)C, 0 /* CUDA_R_32F */, ldc, 68 /* CUBLAS_COMPUTE_32F */, -1 /* CUBLAS_GEMM_DEFAULT */);
}

// CUDA IPC
static inline int bk_has_ipc(bk_cuda* d) {
  return d->cuIpcGetMemHandle && d->cuIpcOpenMemHandle && d->cuIpcCloseMemHandle && d->cuMemGetAddressRange;
}
// handle points at the 64 bytes of a CUipcMemHandle.
static inline bk_res bk_ipc_get(bk_cuda* d, void* handle, bk_dptr p) {
  if (!bk_has_ipc(d)) return BK_ERR_MISSING;
  return d->cuIpcGetMemHandle((bk_ipc_handle*)handle, p);
}
// bk_ipc_open maps with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, so an arena of
// another GPU of the node maps too.
static inline bk_res bk_ipc_open(bk_cuda* d, bk_dptr* p, const void* handle) {
  bk_ipc_handle h;
  if (!bk_has_ipc(d)) return BK_ERR_MISSING;
  memcpy(&h, handle, sizeof h);
  return d->cuIpcOpenMemHandle(p, h, 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */);
}
static inline bk_res bk_ipc_close(bk_cuda* d, bk_dptr p) {
  if (!d->cuIpcCloseMemHandle) return BK_ERR_MISSING;
  return d->cuIpcCloseMemHandle(p);
}
static inline bk_res bk_mem_range(bk_cuda* d, bk_dptr* base, size_t* size, bk_dptr p) {
  if (!d->cuMemGetAddressRange) return BK_ERR_MISSING;
  return d->cuMemGetAddressRange(base, size, p);
}
// CUDA graphs
static inline int bk_has_graphs(bk_cuda* d) {
  return d->cuStreamBeginCapture && d->cuStreamEndCapture && d->cuGraphInstantiateWithFlags && d->cuGraphLaunch &&
         d->cuGraphExecDestroy && d->cuGraphDestroy;
}
// CU_STREAM_CAPTURE_MODE_THREAD_LOCAL (1): only this thread's unsafe calls
// (a synchronising copy, an allocation) spoil the capture, and they do;
// other threads (a KV pool's page copies) go on meanwhile.
static inline bk_res bk_capture_begin(bk_cuda* d, uintptr_t s) { return d->cuStreamBeginCapture((bk_h)s, 1); }
static inline bk_res bk_capture_end(bk_cuda* d, uintptr_t s, uintptr_t* g) {
  bk_h h = 0;
  bk_res r = d->cuStreamEndCapture((bk_h)s, &h);
  *g = (uintptr_t)h;
  return r;
}
static inline bk_res bk_graph_instantiate(bk_cuda* d, uintptr_t* exec, uintptr_t g) {
  bk_h h = 0;
  bk_res r = d->cuGraphInstantiateWithFlags(&h, (bk_h)g, 0);
  *exec = (uintptr_t)h;
  return r;
}
static inline bk_res bk_graph_launch(bk_cuda* d, uintptr_t exec, uintptr_t s) {
  return d->cuGraphLaunch((bk_h)exec, (bk_h)s);
}
static inline bk_res bk_graph_exec_destroy(bk_cuda* d, uintptr_t exec) { return d->cuGraphExecDestroy((bk_h)exec); }
static inline bk_res bk_graph_destroy(bk_cuda* d, uintptr_t g) { return d->cuGraphDestroy((bk_h)g); }

#endif
