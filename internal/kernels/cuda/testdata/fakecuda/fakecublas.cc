// fakecublas.cc: a fake libcublas for the Go tests, on the fake driver's
// host "device" memory. It implements cuBLAS's column-major GEMM
// semantics and argument checks (so transposes and leading dimensions are
// tested), accumulating in float32 as a GPU does; GemmEx accepts only the
// type combinations the backend may use.
//
// A product is queued on the handle's stream through the fake driver
// (fakeabi.h): computed now, or captured into the stream's graph with its
// arguments as they are at the call. As a real cuBLAS may allocate its
// workspace at a product, a product on a capturing stream is refused
// unless cublasSetWorkspace_v2 gave one since the last cublasSetStream_v2
// (which, as in cuBLAS, drops it). Built with -DFAKE_NO_WORKSPACE it lacks
// cublasSetWorkspace_v2, as an older cuBLAS does.
#include "fakeabi.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace {

struct Handle {
  void* stream;  // a bkfake_stream, or null: the legacy stream
  int mathMode;
  void* workspace;
  size_t workspaceBytes;
};

float load(const void* p, int type, int64_t i) {
  switch (type) {
    case 0:  // CUDA_R_32F
      return static_cast<const float*>(p)[i];
    case 2: {  // CUDA_R_16F
      uint16_t h = static_cast<const uint16_t*>(p)[i];
      uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, b;
      if (exp == 0 && man == 0) {
        b = sign;
      } else if (exp == 0) {
        uint32_t e = 127 - 15 + 1;
        while ((man & 0x400) == 0) {
          man <<= 1;
          e--;
        }
        b = sign | e << 23 | (man & 0x3ff) << 13;
      } else if (exp == 0x1f) {
        b = sign | 0xffu << 23 | man << 13;
      } else {
        b = sign | (exp + 112) << 23 | man << 13;
      }
      float f;
      memcpy(&f, &b, 4);
      return f;
    }
    case 14: {  // CUDA_R_16BF
      uint32_t b = (uint32_t) static_cast<const uint16_t*>(p)[i] << 16;
      float f;
      memcpy(&f, &b, 4);
      return f;
    }
  }
  abort();
}

// Gemm is a product's arguments: C = alpha*op(A)*op(B) + beta*C,
// column-major, A of type at and B of bt, C float32.
struct Gemm {
  int ta, tb, m, n, k;
  float alpha;
  const void* A;
  int at, lda;
  const void* B;
  int bt, ldb;
  float beta;
  float* C;
  int ldc;
};

// invalid is cuBLAS's verdict on g's arguments, given at the call.
int invalid(const Gemm& g) {
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.ta < 0 || g.ta > 1 || g.tb < 0 || g.tb > 1) return 7;  // CUBLAS_STATUS_INVALID_VALUE
  if (g.lda < (g.ta ? g.k : g.m) || g.lda < 1 || g.ldb < (g.tb ? g.n : g.k) || g.ldb < 1 || g.ldc < g.m || g.ldc < 1)
    return 7;
  return 0;
}

// run computes a Gemm, accumulating in float32.
void run(const void* p) {
  const Gemm& g = *static_cast<const Gemm*>(p);
  for (int j = 0; j < g.n; j++) {
    for (int i = 0; i < g.m; i++) {
      float s = 0;
      for (int l = 0; l < g.k; l++) {
        float a = g.ta ? load(g.A, g.at, (int64_t)i * g.lda + l) : load(g.A, g.at, (int64_t)l * g.lda + i);
        float b = g.tb ? load(g.B, g.bt, (int64_t)l * g.ldb + j) : load(g.B, g.bt, (int64_t)j * g.ldb + l);
        s += a * b;
      }
      float* c = g.C + (int64_t)j * g.ldc + i;
      *c = g.alpha * s + (g.beta == 0 ? 0 : g.beta * *c);
    }
  }
}

// gemm queues g on h's stream.
int gemm(void* handle, const Gemm& g) {
  if (int r = invalid(g)) return r;
  Handle* h = static_cast<Handle*>(handle);
  if (!h->stream) {
    run(&g);
    return 0;
  }
  bkfake_stream* s = static_cast<bkfake_stream*>(h->stream);
  if (s->capturing(h->stream) && !h->workspace) return 14;  // CUBLAS_STATUS_INTERNAL_ERROR: it would allocate
  return s->enqueue(h->stream, run, &g, sizeof g) == 0 ? 0 : 13;  // CUBLAS_STATUS_EXECUTION_FAILED
}

}  // namespace

extern "C" {

int cublasCreate_v2(void** h) {
  *h = new Handle{nullptr, 0, nullptr, 0};
  return 0;
}
int cublasDestroy_v2(void* h) {
  delete static_cast<Handle*>(h);
  return 0;
}
int cublasSetStream_v2(void* h, void* s) {
  Handle* hd = static_cast<Handle*>(h);
  hd->stream = s;
  hd->workspace = nullptr;
  hd->workspaceBytes = 0;
  return 0;
}
#ifndef FAKE_NO_WORKSPACE
int cublasSetWorkspace_v2(void* h, void* w, size_t bytes) {
  if (!w || bytes == 0) return 7;  // CUBLAS_STATUS_INVALID_VALUE: the backend always gives one
  Handle* hd = static_cast<Handle*>(h);
  hd->workspace = w;
  hd->workspaceBytes = bytes;
  return 0;
}
#endif
int cublasSetMathMode(void* h, int mode) {
  static_cast<Handle*>(h)->mathMode = mode;
  return 0;
}
int cublasGetVersion_v2(void*, int* v) {
  *v = 120000;
  return 0;
}
int cublasSgemm_v2(void* h, int ta, int tb, int m, int n, int k, const float* alpha, const float* A, int lda,
                   const float* B, int ldb, const float* beta, float* C, int ldc) {
  return gemm(h, Gemm{ta, tb, m, n, k, *alpha, A, 0, lda, B, 0, ldb, *beta, C, ldc});
}
int cublasGemmEx(void* h, int ta, int tb, int m, int n, int k, const void* alpha, const void* A, int at, int lda,
                 const void* B, int bt, int ldb, const void* beta, void* C, int ct, int ldc, int compute, int) {
  // CUBLAS_COMPUTE_32F (68) with f32 output, and f16*f16, bf16*bf16 or f32*f32 inputs.
  if (compute != 68 || ct != 0 || at != bt || (at != 0 && at != 2 && at != 14)) return 15;  // NOT_SUPPORTED
  return gemm(h, Gemm{ta, tb, m, n, k, *static_cast<const float*>(alpha), A, at, lda, B, bt, ldb,
                      *static_cast<const float*>(beta), static_cast<float*>(C), ldc});
}

}  // extern "C"
