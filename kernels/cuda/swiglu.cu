// The elementwise kernel family: fills, the residual add, SwiGLU forward/backward, the bias of a
// linear layer and the per-row sigmoid gate (bodies/elementwise.h), plus the row-major cuBLAS GEMM
// every family shares.
#include "bf16_weight_cache.h"
#include "bodies/bf16.h"
#include "bodies/elementwise.h"
#include "bodies/gemm_args.h"
#include "check.h"
#include "device_lanes.cuh"
#include "launchers.h"
#include "troupe/kernels/compute_dtype.h"

namespace troupe::kernels::cuda {

namespace {

// The bf16 operand of a GEMM: the weight arena's bf16 copy where the operand lies inside one
// (q.weights, converted once per write of the weights), else a packed copy in the workspace at
// `packed` (ld = cols). Returns the pointer and sets `ld_out`.
const uint16_t* bf16_operand(const Queue& q, const float* X, size_t rows, size_t cols, int ld, uint16_t* packed,
                             int& ld_out) {
  const size_t extent = rows ? (rows - 1) * static_cast<size_t>(ld) + cols : 0;
  if (q.weights && extent)
    if (const uint16_t* w = q.weights->lookup(X, extent)) {
      ld_out = ld;
      return w;
    }
  if (rows && cols) launch_elements(ToBf16Body{packed, X, cols, static_cast<size_t>(ld)}, rows * cols, q.stream);
  ld_out = static_cast<int>(cols);
  return packed;
}

// C = alpha op(A) op(B) + beta C on bf16 operands (bf16_operand), fp32 accumulation into fp32 C:
// the row-major call swapped into cuBLAS's column-major one as in gemm_args.h.
void gemm_bf16(const Queue& q, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  const size_t ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
  const size_t a_elems = ar * ac, b_elems = br * bc;
  const size_t a_bytes = (a_elems * sizeof(uint16_t) + 255) / 256 * 256, bytes = a_bytes + b_elems * sizeof(uint16_t);
  Bf16Workspace& ws = *q.bf16;
  TROUPE_DEVICE_GROW(ws.data, ws.bytes, bytes, q.stream);
  int la = 0, lb = 0;
  const uint16_t* a16 = bf16_operand(q, A, ar, ac, lda, static_cast<uint16_t*>(ws.data), la);
  const uint16_t* b16 = bf16_operand(q, B, br, bc, ldb,
                                     reinterpret_cast<uint16_t*>(static_cast<char*>(ws.data) + a_bytes), lb);
  // Tensor cores for bf16 inputs: the handle's pedantic mode (no TF32 for fp32 GEMMs) is lifted for this call.
  TROUPE_CUBLAS_CHECK(cublasSetMathMode(q.blas, CUBLAS_DEFAULT_MATH));
  const cublasStatus_t st =
      cublasGemmEx(q.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha,
                   b16, CUDA_R_16BF, lb, a16, CUDA_R_16BF, la, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  TROUPE_CUBLAS_CHECK(cublasSetMathMode(q.blas, CUBLAS_PEDANTIC_MATH));
  TROUPE_CUBLAS_CHECK(st);
}

}  // namespace

void convert_to_bf16(const Queue& q, uint16_t* dst, const float* src, size_t n) {
  if (n) launch_elements(ToBf16Body{dst, src, n, n}, n, q.stream);
}

void gemm(const Queue& q, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (q.bf16 && compute_dtype() == ComputeDtype::bf16 && K > 0)
    return gemm_bf16(q, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const ColMajorGemm g = col_major_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
  // policy.allow_tf32: fp32 GEMMs on TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation);
  // otherwise the handle stays pedantic (true fp32).
  const bool tf32 = allow_tf32();
  if (tf32) TROUPE_CUBLAS_CHECK(cublasSetMathMode(q.blas, CUBLAS_TF32_TENSOR_OP_MATH));
  const cublasStatus_t st = cublasSgemm(q.blas, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha, g.first,
                                        g.ld_first, g.second, g.ld_second, &beta, g.c, g.ldc);
  if (tf32) TROUPE_CUBLAS_CHECK(cublasSetMathMode(q.blas, CUBLAS_PEDANTIC_MATH));
  TROUPE_CUBLAS_CHECK(st);
}

void launch_fill(const Queue& q, float* x, size_t n, float value) { launch_elements(FillBody{x, value}, n, q.stream); }
void launch_scale(const Queue& q, float* x, size_t n, double s) { launch_elements(ScaleBody{x, s}, n, q.stream); }
void launch_add(const Queue& q, float* out, const float* a, const float* b, size_t n) {
  launch_elements(AddBody{out, a, b}, n, q.stream);
}
void launch_lora_dropout(const Queue& q, float* out, const float* in, size_t n, float p, uint64_t seed) {
  launch_elements(LoraDropoutBody{out, in, p, 1.0f / (1.0f - p), seed}, n, q.stream);
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
