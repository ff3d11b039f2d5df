// LoRA's low-rank path for one or two rows (a decode step), internal to kernels/cpu/: lora_forward's
// path for N <= kGemmKernelMaxRows, and what quant_projections_forward runs inside its parallel
// region. Both products are small_gemm's per-element chains, the ones batch-invariant mode's
// gemm_nt_invariant runs, so an element's bits depend only on its two input rows: never on which
// rows or columns a call covers, nor on the thread that runs it.
#pragma once

#include "small_gemm.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels::lora_rows {

// Whether N rows take this path (the small_gemm kernel is there; else lora_forward's gemm_blocked).
inline bool applies(int N) { return N > 0 && N <= kGemmKernelMaxRows && small_gemm::available(); }

// Columns [j0, j1) of u (N, r) = inp (N, C) . A^T, A (r, C).                                  [assigned]
inline void down(float* u, const float* inp, const float* A, int N, int C, int r, int j0, int j1) {
  small_gemm::gemm_nt_rows(N, j0, j1, C, 1.0f, inp, C, A, C, 0.0f, u, r);
}
// Columns [o0, o1) of out (N, OC) += scale * u (N, r) . B^T, B (OC, r).                        [+=]
inline void up(float* out, const float* u, const float* B, int N, int OC, int r, float scale, int o0, int o1) {
  small_gemm::gemm_nt_rows(N, o0, o1, r, scale, u, r, B, r, 1.0f, out, OC);
}

}  // namespace troupe::kernels::lora_rows
