// bf16 GEMMs on frozen weights (a scorer's log-prob forwards, distill.teacher_dtype: bf16): each
// weight matrix a forward multiplies by is rounded to bf16 (nearest even) once and kept, packed for
// the CPU's AVX512-BF16 dot product (vdpbf16ps); each GEMM rounds its activations to bf16 and
// accumulates in fp32. Invariants: every output element is one fixed chain over k (pairs of k in
// order, fp32 accumulator), whatever the thread count and the shape of the call, so a forward's
// numbers are the same bits every run; the weights behind a Bf16Weights never change while it
// lives (they are packed once, keyed by their address and shape).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace troupe::kernels {

// Whether this CPU runs AVX512-BF16 (and AVX512F/BW): the bf16 GEMM's instructions.
bool cpu_has_avx512_bf16();

// Frozen fp32 weights as packed bf16 and the GEMM over them.
class Bf16Weights {
 public:
  Bf16Weights();
  ~Bf16Weights();
  // out (N x OC) = bf16(inp) (N x C) · bf16(W)^T, W (OC x C) row-major: matmul_forward's contract.
  // Requires cpu_has_avx512_bf16().
  void matmul(float* out, const float* inp, const float* W, int N, int C, int OC);
  size_t packed_bytes() const;  // bf16 copies held

  struct Packed;

 private:
  const Packed& packed(const float* W, int C, int OC);
  mutable std::mutex mu_;
  std::map<std::tuple<const float*, int, int>, std::unique_ptr<Packed>> packed_;
};

// While it lives (and the CPU has AVX512-BF16), matmul_forward<float> on the calling thread, the
// model's projections and the log-prob head's forward, runs on `w` unless the thread is in
// batch-invariant mode. Without AVX512-BF16 it does nothing: the fp32 kernels run.
class Bf16WeightsScope {
 public:
  explicit Bf16WeightsScope(Bf16Weights* w);
  ~Bf16WeightsScope();
  Bf16WeightsScope(const Bf16WeightsScope&) = delete;
  Bf16WeightsScope& operator=(const Bf16WeightsScope&) = delete;

 private:
  Bf16Weights* prev_;
};

// The calling thread's Bf16Weights (a Bf16WeightsScope's), or null.
Bf16Weights* bf16_weights();

}  // namespace troupe::kernels
