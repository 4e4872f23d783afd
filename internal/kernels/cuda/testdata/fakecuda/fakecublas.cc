// fakecublas.cc: a fake libcublas for the Go tests, on the fake driver's
// host "device" memory. It implements cuBLAS's column-major GEMM
// semantics and argument checks (so transposes and leading dimensions are
// tested), accumulating in float32 as a GPU does; GemmEx accepts only the
// type combinations the backend may use.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace {

struct Handle {
  void* stream;
  int mathMode;
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

// gemm: C = alpha*op(A)*op(B) + beta*C, column-major, float32 sums.
int gemm(int ta, int tb, int m, int n, int k, float alpha, const void* A, int at, int lda, const void* B, int bt,
         int ldb, float beta, float* C, int ldc) {
  if (m < 0 || n < 0 || k < 0 || ta < 0 || ta > 1 || tb < 0 || tb > 1) return 7;  // CUBLAS_STATUS_INVALID_VALUE
  if (lda < (ta ? k : m) || lda < 1 || ldb < (tb ? n : k) || ldb < 1 || ldc < m || ldc < 1) return 7;
  for (int j = 0; j < n; j++) {
    for (int i = 0; i < m; i++) {
      float s = 0;
      for (int l = 0; l < k; l++) {
        float a = ta ? load(A, at, (int64_t)i * lda + l) : load(A, at, (int64_t)l * lda + i);
        float b = tb ? load(B, bt, (int64_t)l * ldb + j) : load(B, bt, (int64_t)j * ldb + l);
        s += a * b;
      }
      float* c = C + (int64_t)j * ldc + i;
      *c = alpha * s + (beta == 0 ? 0 : beta * *c);
    }
  }
  return 0;
}

}  // namespace

extern "C" {

int cublasCreate_v2(void** h) {
  *h = new Handle{nullptr, 0};
  return 0;
}
int cublasDestroy_v2(void* h) {
  delete static_cast<Handle*>(h);
  return 0;
}
int cublasSetStream_v2(void* h, void* s) {
  static_cast<Handle*>(h)->stream = s;
  return 0;
}
int cublasSetMathMode(void* h, int mode) {
  static_cast<Handle*>(h)->mathMode = mode;
  return 0;
}
int cublasGetVersion_v2(void*, int* v) {
  *v = 120000;
  return 0;
}
int cublasSgemm_v2(void*, int ta, int tb, int m, int n, int k, const float* alpha, const float* A, int lda,
                   const float* B, int ldb, const float* beta, float* C, int ldc) {
  return gemm(ta, tb, m, n, k, *alpha, A, 0, lda, B, 0, ldb, *beta, C, ldc);
}
int cublasGemmEx(void*, int ta, int tb, int m, int n, int k, const void* alpha, const void* A, int at, int lda,
                 const void* B, int bt, int ldb, const void* beta, void* C, int ct, int ldc, int compute, int) {
  // CUBLAS_COMPUTE_32F (68) with f32 output, and f16*f16, bf16*bf16 or f32*f32 inputs.
  if (compute != 68 || ct != 0 || at != bt || (at != 0 && at != 2 && at != 14)) return 15;  // NOT_SUPPORTED
  return gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha), A, at, lda, B, bt, ldb,
              *static_cast<const float*>(beta), static_cast<float*>(C), ldc);
}

}  // extern "C"
