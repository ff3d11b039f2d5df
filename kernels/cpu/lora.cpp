// The CPU specification of LoRA's low-rank path (lora.h), composed of gemm_blocked calls, so its
// bits, like every other GEMM's, do not depend on the thread count (and follow batch-invariant mode).
// Invariant: four GEMMs in backward, two in forward (one or two rows: small_gemm's chains,
// lora_rows.h, in every mode); u is recomputed from inp and A; dropout's mask is a function of
// (seed, index) alone.
#include "troupe/kernels/lora.h"

#include <type_traits>

#include "lora_rows.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels {

template <class T>
void lora_forward(T* out, const T* inp, const T* A, const T* B, T* scratch, int N, int C, int OC, int r, T scale) {
  if (N <= 0 || C <= 0 || OC <= 0 || r <= 0) return;
  T* u = scratch;  // (N, r)
  if constexpr (std::is_same_v<T, float>) {
    if (lora_rows::applies(N)) {  // a decode step: the chains batch-invariant mode runs, in every mode
      lora_rows::down(u, inp, A, N, C, r, 0, r);
      lora_rows::up(out, u, B, N, OC, r, scale, 0, OC);
      return;
    }
  }
  gemm_blocked(false, true, N, r, C, T(1), inp, C, A, C, T(0), u, r);
  gemm_blocked(false, true, N, OC, r, scale, u, r, B, r, T(1), out, OC);
}

template <class T>
void lora_backward(T* dinp, T* dA, T* dB, const T* dout, const T* inp, const T* A, const T* B, T* scratch, int N,
                   int C, int OC, int r, T scale) {
  if (N <= 0 || C <= 0 || OC <= 0 || r <= 0) return;
  T* u = scratch;                                // (N, r)
  T* du = scratch + static_cast<size_t>(N) * r;  // (N, r)
  gemm_blocked(false, true, N, r, C, T(1), inp, C, A, C, T(0), u, r);
  gemm_blocked(true, false, OC, r, N, scale, dout, OC, u, r, T(1), dB, r);
  gemm_blocked(false, false, N, r, OC, scale, dout, OC, B, r, T(0), du, r);
  gemm_blocked(true, false, r, C, N, T(1), du, r, inp, C, T(1), dA, C);
  if (dinp) gemm_blocked(false, false, N, C, r, T(1), du, r, A, C, T(1), dinp, C);
}

void lora_dropout(float* out, const float* in, size_t n, float p, uint64_t seed) {
  const float keep_scale = 1.0f / (1.0f - p);
  const auto N = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::ptrdiff_t i = 0; i < N; ++i)
    out[i] = lora_dropout_keep(seed, static_cast<size_t>(i), p) ? in[i] * keep_scale : 0.0f;
}

template void lora_forward<float>(float*, const float*, const float*, const float*, float*, int, int, int, int, float);
template void lora_forward<double>(double*, const double*, const double*, const double*, double*, int, int, int, int,
                                   double);
template void lora_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                   float*, int, int, int, int, float);
template void lora_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                    const double*, double*, int, int, int, int, double);

}  // namespace troupe::kernels
