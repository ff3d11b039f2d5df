// Plain-loop GEMM behind standalone/cblas.h for the standalone kernels/ build (no BLAS package on
// the GPU machines): correct, row-major only, not fast. The GPU tests use the CPU ops only as the
// reference, so speed does not matter there; benchmark rows against the CPU backend say so.
#include "cblas.h"

#include <cstdio>
#include <cstdlib>

namespace {

template <class T>
void gemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, T alpha, const T* A, int lda,
          const T* B, int ldb, T beta, T* C, int ldc) {
  if (order != CblasRowMajor) {
    std::fprintf(stderr, "naive cblas: only CblasRowMajor is implemented\n");
    std::abort();
  }
  const bool at = ta != CblasNoTrans, bt = tb != CblasNoTrans;
  for (int i = 0; i < M; ++i) {
    T* c = C + static_cast<long>(i) * ldc;
    for (int j = 0; j < N; ++j) c[j] = beta == T(0) ? T(0) : beta * c[j];
    for (int p = 0; p < K; ++p) {
      const T a = alpha * (at ? A[static_cast<long>(p) * lda + i] : A[static_cast<long>(i) * lda + p]);
      if (a == T(0)) continue;
      if (bt)
        for (int j = 0; j < N; ++j) c[j] += a * B[static_cast<long>(j) * ldb + p];
      else
        for (int j = 0; j < N; ++j) c[j] += a * B[static_cast<long>(p) * ldb + j];
    }
  }
}

}  // namespace

extern "C" {
void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  gemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void cblas_dgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
                 const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  gemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void openblas_set_num_threads(int) {}
}
