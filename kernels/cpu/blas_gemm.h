// The row-major BLAS GEMM under one name for float (sgemm) and double (dgemm), for the CPU ops'
// templates (internal to kernels/cpu/).
#pragma once

#include <cblas.h>
#include <omp.h>

namespace troupe::kernels {

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* Cm, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* Cm, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}

// Whether a GEMM of `macs` multiply-adds is worth splitting into blocks over the OpenMP threads
// (BLAS itself runs single-threaded): big enough, not inside a parallel region, and threads to use.
inline bool gemm_worth_splitting(double macs) {
  return macs > 1e6 && !omp_in_parallel() && omp_get_max_threads() > 1;
}

}  // namespace troupe::kernels
