// The row-major GEMM the CPU ops use (ops.h gemm_blocked: C (M, N) = alpha op(A) op(B) + beta C)
// expressed as the column-major call cuBLAS takes: a row-major X is the column-major X^T, so
// C^T = op(B)^T op(A)^T swaps the operands and the sizes. swiglu.cu's gemm() passes these to
// cublasSgemm; kernels.cuda_bodies_on_host checks them with a column-major reference GEMM.
#pragma once

namespace troupe::kernels::cuda {

// One row-major GEMM as ops.h gemm_blocked takes it: C (M, N) = alpha op(A) op(B) + beta C. A batch
// of these (independent: no output is another's input) is what an executor's gemm_batch issues, as
// the MoE layer's per-expert GEMMs of one phase (moe_layer.h).
struct RowMajorGemm {
  bool trans_a, trans_b;
  int M, N, K;
  float alpha;
  const float* A;
  int lda;
  const float* B;
  int ldb;
  float beta;
  float* C;
  int ldc;
};

struct ColMajorGemm {
  bool trans_first, trans_second;  // cublas transa, transb
  int m, n, k;
  const float* first;  // cublas A
  int ld_first;
  const float* second;  // cublas B
  int ld_second;
  float* c;
  int ldc;
};

inline ColMajorGemm col_major_gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                                   const float* B, int ldb, float* C, int ldc) {
  return {trans_b, trans_a, N, M, K, B, ldb, A, lda, C, ldc};
}

}  // namespace troupe::kernels::cuda
