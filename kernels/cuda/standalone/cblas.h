// The CBLAS subset the CPU ops call (row-major sgemm/dgemm, openblas_set_num_threads), declared
// for the standalone kernels/ build on machines without a BLAS development package (the lent GPU
// machines): naive_cblas.cpp implements it with plain loops. Only that build sees this header;
// the project build uses OpenBLAS's cblas.h.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CblasRowMajor = 101, CblasColMajor = 102 } CBLAS_ORDER;
typedef enum { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 } CBLAS_TRANSPOSE;

void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
void cblas_dgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
                 const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc);
void openblas_set_num_threads(int n);

#ifdef __cplusplus
}
#endif
