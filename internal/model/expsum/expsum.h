#include <stdint.h>

// es_sum writes exp((l[i] - top) * inv) to p[i] (unless p is NULL) for
// i < n and returns their sum: element i is added to partial sum i % 8 in
// increasing i, and the partials are added as ((0+1)+(2+3))+((4+5)+(6+7)).
// Every path (AVX-512, AVX2, scalar) computes each exponential and each
// addition in the same order with the same roundings, so the result is the
// same bit for bit on every x86 CPU and on other architectures.
double es_sum(double *p, const float *l, int64_t n, double top, double inv);
// es_max returns the largest of l[0..n), n >= 1, or NaN if one is NaN.
float es_max(const float *l, int64_t n);
// es_simd reports the widest path this CPU takes: 2 AVX-512, 1 AVX2, 0 scalar.
int es_simd(void);
// es_limit caps the path at level, at most what the CPU has (tests: every
// path on one CPU).
void es_limit(int level);
