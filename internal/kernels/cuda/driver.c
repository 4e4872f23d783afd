// driver.c: dlopen the CUDA driver and cuBLAS and resolve their versioned
// entry points by name.
#include "driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char* name;
  size_t off;
  int required;
} bk_sym;

#define SYM(field, name, req) {name, offsetof(bk_cuda, field), req}
static const bk_sym cuda_syms[] = {
    SYM(cuDriverGetVersion, "cuDriverGetVersion", 1),
    SYM(cuInit, "cuInit", 1),
    SYM(cuDeviceGetCount, "cuDeviceGetCount", 1),
    SYM(cuDeviceGet, "cuDeviceGet", 1),
    SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute", 1),
    SYM(cuDeviceGetName, "cuDeviceGetName", 1),
    SYM(cuDeviceTotalMem, "cuDeviceTotalMem_v2", 1),
    SYM(cuMemGetInfo, "cuMemGetInfo_v2", 1),
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0),
    SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", 0),
    SYM(cuCtxCreate, "cuCtxCreate_v2", 0),
    SYM(cuCtxDestroy, "cuCtxDestroy_v2", 1),
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent", 1),
    SYM(cuModuleLoadData, "cuModuleLoadData", 1),
    SYM(cuModuleUnload, "cuModuleUnload", 1),
    SYM(cuModuleGetFunction, "cuModuleGetFunction", 1),
    SYM(cuMemAlloc, "cuMemAlloc_v2", 1),
    SYM(cuMemFree, "cuMemFree_v2", 1),
    SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2", 1),
    SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2", 1),
    SYM(cuMemcpyDtoD, "cuMemcpyDtoD_v2", 1),
    SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", 1),
    SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", 1),
    SYM(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", 1),
    SYM(cuMemsetD32Async, "cuMemsetD32Async", 1),
    SYM(cuLaunchKernel, "cuLaunchKernel", 1),
    SYM(cuStreamCreate, "cuStreamCreate", 1),
    SYM(cuStreamDestroy, "cuStreamDestroy_v2", 1),
    SYM(cuStreamSynchronize, "cuStreamSynchronize", 1),
    SYM(cuEventCreate, "cuEventCreate", 1),
    SYM(cuEventDestroy, "cuEventDestroy_v2", 1),
    SYM(cuEventRecord, "cuEventRecord", 1),
    SYM(cuStreamWaitEvent, "cuStreamWaitEvent", 1),
    SYM(cuEventSynchronize, "cuEventSynchronize", 1),
    SYM(cuEventElapsedTime, "cuEventElapsedTime", 1),
    SYM(cuGetErrorString, "cuGetErrorString", 1),
    SYM(cuMemHostRegister, "cuMemHostRegister_v2", 0),
    SYM(cuMemHostUnregister, "cuMemHostUnregister", 0),
    SYM(cuMemHostAlloc, "cuMemHostAlloc", 0),
    SYM(cuMemFreeHost, "cuMemFreeHost", 0),
    // CUDA IPC
    SYM(cuIpcGetMemHandle, "cuIpcGetMemHandle", 0),
    SYM(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", 0),
    SYM(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 0),
    SYM(cuMemGetAddressRange, "cuMemGetAddressRange_v2", 0),
    // CUDA graphs
    SYM(cuStreamBeginCapture, "cuStreamBeginCapture_v2", 0),
    SYM(cuStreamEndCapture, "cuStreamEndCapture", 0),
    SYM(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 0),
    SYM(cuGraphLaunch, "cuGraphLaunch", 0),
    SYM(cuGraphExecDestroy, "cuGraphExecDestroy", 0),
    SYM(cuGraphDestroy, "cuGraphDestroy", 0),
    // The emulated driver's mark
    SYM(hostVisibleMemory, "bkfake_host_visible_memory", 0),
};
#undef SYM

#define BSYM(field, name, req) {name, offsetof(bk_cublas, field), req}
static const bk_sym cublas_syms[] = {
    BSYM(create, "cublasCreate_v2", 1),
    BSYM(destroy, "cublasDestroy_v2", 1),
    BSYM(setStream, "cublasSetStream_v2", 1),
    BSYM(getVersion, "cublasGetVersion_v2", 0),
    BSYM(sgemm, "cublasSgemm_v2", 1),
    BSYM(gemmEx, "cublasGemmEx", 1),
    BSYM(setWorkspace, "cublasSetWorkspace_v2", 0),
};
#undef BSYM

// resolve fills the function pointers of obj; 0, or -1 with err set.
static int resolve(void* lib, void* obj, const bk_sym* syms, size_t n, const char* libname, char* err, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    void* p = dlsym(lib, syms[i].name);
    if (!p && syms[i].required) {
      snprintf(err, errlen, "%s lacks %s", libname, syms[i].name);
      return -1;
    }
    memcpy((char*)obj + syms[i].off, &p, sizeof p);
  }
  return 0;
}

static void* open_lib(const char* name, char* err, size_t errlen) {
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    snprintf(err, errlen, "%s not found (%s)", name, e ? e : "dlopen failed");
  }
  return lib;
}

bk_cuda* bk_cuda_load(const char* name, char* err, size_t errlen) {
  void* lib = open_lib(name, err, errlen);
  if (!lib) return NULL;
  bk_cuda* d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  d->lib = lib;
  if (resolve(lib, d, cuda_syms, sizeof cuda_syms / sizeof cuda_syms[0], name, err, errlen) != 0) {
    free(d);
    return NULL;  // the library stays loaded: unloading a driver is not safe
  }
  return d;
}

bk_cublas* bk_cublas_load(const char* name, char* err, size_t errlen) {
  void* lib = open_lib(name, err, errlen);
  if (!lib) return NULL;
  bk_cublas* b = calloc(1, sizeof *b);
  if (!b) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  b->lib = lib;
  if (resolve(lib, b, cublas_syms, sizeof cublas_syms / sizeof cublas_syms[0], name, err, errlen) != 0) {
    dlclose(lib);
    free(b);
    return NULL;
  }
  return b;
}
