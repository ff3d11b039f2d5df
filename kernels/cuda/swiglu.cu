// The elementwise kernel family: fills, the residual add, SwiGLU forward/backward, the bias of a
// linear layer and the per-row sigmoid gate (bodies/elementwise.h), plus the row-major cuBLAS GEMM
// every family shares.
#include "bodies/elementwise.h"
#include "bodies/gemm_args.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

void gemm(const Queue& q, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  const ColMajorGemm g = col_major_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
  TROUPE_CUBLAS_CHECK(cublasSgemm(q.blas, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha, g.first,
                                  g.ld_first, g.second, g.ld_second, &beta, g.c, g.ldc));
}

void launch_fill(const Queue& q, float* x, size_t n, float value) { launch_elements(FillBody{x, value}, n, q.stream); }
void launch_add(const Queue& q, float* out, const float* a, const float* b, size_t n) {
  launch_elements(AddBody{out, a, b}, n, q.stream);
}
void launch_swiglu_forward(const Queue& q, float* out, const float* gate, const float* up, size_t n) {
  launch_elements(SwigluForwardBody{out, gate, up}, n, q.stream);
}
void launch_swiglu_backward(const Queue& q, float* dgate, float* dup, const float* dout, const float* gate,
                            const float* up, size_t n) {
  launch_elements(SwigluBackwardBody{dgate, dup, dout, gate, up}, n, q.stream);
}
void launch_bias_forward(const Queue& q, float* out, const float* bias, int N, int OC) {
  launch_elements(BiasForwardBody{out, bias, OC}, static_cast<size_t>(N) * OC, q.stream);
}
void launch_bias_backward(const Queue& q, float* dbias, const float* dout, int N, int OC) {
  launch_elements(BiasBackwardBody{dbias, dout, N, OC}, static_cast<size_t>(OC), q.stream);
}
void launch_sigmoid_gate_forward(const Queue& q, float* out, const float* gate, const float* x, int N, int C) {
  launch_elements(SigmoidGateForwardBody{out, gate, x, C}, static_cast<size_t>(N) * C, q.stream);
}
void launch_sigmoid_gate_backward(const Queue& q, float* dgate, float* dx, const float* dout, const float* gate,
                                  const float* x, int N, int C) {
  launch_rows(SigmoidGateBackwardBody{dgate, dx, dout, gate, x, C}, N, q.stream);
}

}  // namespace troupe::kernels::cuda
