// The chunked LM head + log-softmax's launch sequence (chunked_logprob.h's op) over an executor
// (see moe_layer.h for the Exec interface): per chunk of vocabulary columns one GEMM of logits
// into scratch and one fold of each row; V <= chunk runs the whole-vocabulary bodies. `sum` (N
// floats) holds each row's running sum of exponentials, device memory the backend owns.
#pragma once

#include "logprob.h"

namespace troupe::kernels::cuda {

template <class Exec>
void chunked_logprob_forward_on(Exec& ex, float* logp, float* entropy, float* lse, const float* h, const float* W,
                                const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                                float* scratch, float* sum) {
  if (N <= 0) return;
  const float inv_t = 1.0f / temperature;
  if (chunk <= 0 || V <= chunk) {
    ex.gemm(false, true, N, V, C, 1.0f, h, C, W, C, 0.0f, scratch, V);
    ex.rows(LogprobForwardBody{logp, entropy, lse, scratch, targets, inv_t, V}, N);
    return;
  }
  ex.each(ChunkInitBody{logp, entropy, lse, sum}, static_cast<size_t>(N));
  for (int c0 = 0; c0 < V; c0 += chunk) {
    const int cols = V - c0 < chunk ? V - c0 : chunk;
    ex.gemm(false, true, N, cols, C, 1.0f, h, C, W + static_cast<size_t>(c0) * C, C, 0.0f, scratch, cols);
    ex.rows(ChunkFoldBody{logp, entropy, lse, sum, scratch, targets, inv_t, cols, c0}, N);
  }
  ex.each(ChunkFinishBody{logp, entropy, lse, sum, targets}, static_cast<size_t>(N));
}

template <class Exec>
void chunked_logprob_backward_on(Exec& ex, float* dh, float* dW, const float* dlogp, const float* dentropy,
                                 const float* h, const float* W, const float* lse, const float* entropy,
                                 const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                                 float* scratch) {
  if (N <= 0) return;
  const float inv_t = 1.0f / temperature;
  const int step = (chunk <= 0 || V <= chunk) ? V : chunk;
  for (int c0 = 0; c0 < V; c0 += step) {
    const int cols = V - c0 < step ? V - c0 : step;
    const float* Wc = W + static_cast<size_t>(c0) * C;
    ex.gemm(false, true, N, cols, C, 1.0f, h, C, Wc, C, 0.0f, scratch, cols);
    if (step == V)
      ex.rows(LogprobBackwardBody{scratch, dlogp, dentropy, scratch, lse, targets, inv_t, V}, N);
    else
      ex.each(ChunkBackwardBody{scratch, dlogp, dentropy, lse, entropy, targets, inv_t, cols, c0},
              static_cast<size_t>(N) * cols);
    if (dh) ex.gemm(false, false, N, C, cols, 1.0f, scratch, cols, Wc, C, 1.0f, dh, C);
    if (dW) ex.gemm(true, false, cols, C, N, 1.0f, scratch, cols, h, C, 1.0f, dW + static_cast<size_t>(c0) * C, C);
  }
}

}  // namespace troupe::kernels::cuda
