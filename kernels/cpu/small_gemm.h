// The row-times-row kernel gemm_blocked (ops.cpp) uses for GEMMs of one or two rows: a decode
// step's projections and LM head at batch 1, where OpenBLAS's packed sgemm spends more time
// packing than multiplying and reads a wide weight twice (once per K panel).
#pragma once

namespace troupe::kernels::small_gemm {

// Whether this CPU runs the kernel (AVX2 and FMA); without them gemm_blocked keeps OpenBLAS.
bool available();

// Rows [n0, n1) of C (M, N) = alpha A (M, K) . B (N, K)^T + beta C, all row-major; beta == 0
// assigns. Each element is one fixed chain: eight lanes of fused multiply-adds over K in steps of
// 8 (lane j takes k = j mod 8), a fixed pairwise sum of the lanes, then the K % 8 tail in order.
// An element's bits therefore depend only on its row of A and its row of B, never on n0, n1, M or
// which thread runs the call. Needs available().
void gemm_nt_rows(int M, int n0, int n1, int K, float alpha, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc);

}  // namespace troupe::kernels::small_gemm
