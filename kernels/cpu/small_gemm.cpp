// AVX2/FMA body of small_gemm.h. Register tiles of NR rows of B by MR rows of A; every tile shape
// runs the same per-element chain (see the header), so the tiling changes speed, never bits.
#include "small_gemm.h"

#include <cmath>
#include <cstddef>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TROUPE_SMALL_GEMM_X86 1
#endif

namespace troupe::kernels::small_gemm {

#if TROUPE_SMALL_GEMM_X86

namespace {

#define TROUPE_AVX2 __attribute__((target("avx2,fma")))

// (v0 + v4) + (v2 + v6) + ((v1 + v5) + (v3 + v7)), the same for every element.
TROUPE_AVX2 inline float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int NR, int MR>
TROUPE_AVX2 inline void tile(int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C,
                             int ldc) {
  __m256 acc[NR][MR];
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int K8 = K & ~7;
  for (int k = 0; k < K8; k += 8) {
    __m256 a[MR];
    for (int j = 0; j < MR; ++j) a[j] = _mm256_loadu_ps(A + static_cast<size_t>(j) * lda + k);
    for (int i = 0; i < NR; ++i) {
      const __m256 b = _mm256_loadu_ps(B + static_cast<size_t>(i) * ldb + k);
      for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_fmadd_ps(b, a[j], acc[i][j]);
    }
  }
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j) {
      const float* a = A + static_cast<size_t>(j) * lda;
      const float* b = B + static_cast<size_t>(i) * ldb;
      float s = lane_sum(acc[i][j]);
      for (int k = K8; k < K; ++k) s = std::fma(b[k], a[k], s);
      float* c = C + static_cast<size_t>(j) * ldc + i;
      *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;
    }
}

// NR rows of B against every row of A, two rows of A at a time.
template <int NR>
TROUPE_AVX2 void rows_of_b(int M, int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                           float* C, int ldc) {
  int m = 0;
  for (; m + 2 <= M; m += 2)
    tile<NR, 2>(K, alpha, A + static_cast<size_t>(m) * lda, lda, B, ldb, beta, C + static_cast<size_t>(m) * ldc, ldc);
  if (m < M) tile<NR, 1>(K, alpha, A + static_cast<size_t>(m) * lda, lda, B, ldb, beta, C + static_cast<size_t>(m) * ldc, ldc);
}

TROUPE_AVX2 void gemm_nt_rows_avx2(int M, int n0, int n1, int K, float alpha, const float* A, int lda, const float* B,
                                   int ldb, float beta, float* C, int ldc) {
  int n = n0;
  auto b_row = [&](int r) { return B + static_cast<size_t>(r) * ldb; };
  if (M == 1)  // eight independent chains: enough in flight to hide the FMA latency
    for (; n + 8 <= n1; n += 8) tile<8, 1>(K, alpha, A, lda, b_row(n), ldb, beta, C + n, ldc);
  for (; n + 4 <= n1; n += 4) rows_of_b<4>(M, K, alpha, A, lda, b_row(n), ldb, beta, C + n, ldc);
  for (; n < n1; ++n) rows_of_b<1>(M, K, alpha, A, lda, b_row(n), ldb, beta, C + n, ldc);
}

#undef TROUPE_AVX2

}  // namespace

bool available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

void gemm_nt_rows(int M, int n0, int n1, int K, float alpha, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc) {
  gemm_nt_rows_avx2(M, n0, n1, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#else  // not x86: gemm_blocked never calls the kernel

bool available() { return false; }
void gemm_nt_rows(int, int, int, int, float, const float*, int, const float*, int, float, float*, int) {}

#endif

}  // namespace troupe::kernels::small_gemm
