// The chunked LM head + log-softmax (troupe/kernels/chunked_logprob.h). Each chunk's logits come
// from matmul_forward on the chunk's rows of W (the same fixed-row-block GEMM as the whole head),
// and each row keeps an online (max, sum e^(z-m), sum e^(z-m) z) that a larger chunk max rescales.
#include "troupe/kernels/chunked_logprob.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "troupe/kernels/ops.h"

namespace troupe::kernels {

size_t chunked_logprob_scratch_floats(int N, int V, int chunk) {
  const int cols = chunk > 0 ? std::min(V, chunk) : V;
  return static_cast<size_t>(std::max(N, 0)) * static_cast<size_t>(std::max(cols, 0));
}

template <class T>
void chunked_logprob_forward(T* logp, T* entropy, T* lse, const T* h, const T* W, const int32_t* targets,
                             float temperature, int N, int C, int V, int chunk, T* scratch) {
  if (N <= 0) return;
  if (chunk <= 0 || V <= chunk) {  // one chunk: exactly the whole-vocabulary ops
    matmul_forward(scratch, h, W, N, C, V);
    logprob_forward(logp, entropy, lse, scratch, targets, temperature, N, V);
    return;
  }
  const T inv_t = T(1) / T(temperature);
  // running state per row, kept in the outputs: lse = max, entropy = sum e^(z-m) z, logp = z[target]
  std::vector<T> sum(static_cast<size_t>(N), T(0));
  for (int n = 0; n < N; ++n) {
    lse[n] = -std::numeric_limits<T>::infinity();
    entropy[n] = T(0);
    logp[n] = T(0);
  }
  for (int c0 = 0; c0 < V; c0 += chunk) {
    const int cols = std::min(chunk, V - c0);
    matmul_forward(scratch, h, W + static_cast<size_t>(c0) * C, N, C, cols);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * cols))
    for (int n = 0; n < N; ++n) {
      const T* z = scratch + static_cast<size_t>(n) * cols;
      T m = lse[n];
      T cm = -std::numeric_limits<T>::infinity();
      for (int i = 0; i < cols; ++i) cm = std::max(cm, z[i] * inv_t);
      T s = sum[n], sz = entropy[n];
      if (cm > m) {  // a larger max: rescale what the earlier chunks summed
        const T r = std::exp(m - cm);  // 0 on the first chunk
        s *= r;
        sz *= r;
        m = cm;
      }
      for (int i = 0; i < cols; ++i) {
        const T zi = z[i] * inv_t;
        const T e = std::exp(zi - m);
        s += e;
        sz += e * zi;
      }
      lse[n] = m;
      sum[n] = s;
      entropy[n] = sz;
      const int32_t tg = targets[n];
      if (tg >= c0 && tg < c0 + cols) logp[n] = z[tg - c0] * inv_t;
    }
  }
  for (int n = 0; n < N; ++n) {
    const T L = lse[n] + std::log(sum[n]);
    entropy[n] = L - entropy[n] / sum[n];
    logp[n] = targets[n] >= 0 ? logp[n] - L : T(0);
    lse[n] = L;
  }
}

template <class T>
void chunked_logprob_backward(T* dh, T* dW, const T* dlogp, const T* dentropy, const T* h, const T* W, const T* lse,
                              const T* entropy, const int32_t* targets, float temperature, int N, int C, int V,
                              int chunk, T* scratch) {
  if (N <= 0) return;
  if (chunk <= 0 || V <= chunk) {  // one chunk: exactly the whole-vocabulary ops
    matmul_forward(scratch, h, W, N, C, V);
    logprob_backward(scratch, dlogp, dentropy, scratch, lse, targets, temperature, N, V);
    matmul_backward(dh, dW, scratch, h, W, N, C, V);
    return;
  }
  const T inv_t = T(1) / T(temperature);
  for (int c0 = 0; c0 < V; c0 += chunk) {
    const int cols = std::min(chunk, V - c0);
    const T* Wc = W + static_cast<size_t>(c0) * C;
    matmul_forward(scratch, h, Wc, N, C, cols);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * cols))
    for (int n = 0; n < N; ++n) {
      T* z = scratch + static_cast<size_t>(n) * cols;  // logits in, d/dlogits out
      const T L = lse[n];
      const T gl = (dlogp && targets[n] >= 0) ? dlogp[n] : T(0);
      const T ge = dentropy ? dentropy[n] : T(0);
      const T H = ge != T(0) ? entropy[n] : T(0);
      // d logp / dz_i = [i == target] - p_i;  d H / dz_i = -p_i (log p_i + H); then d/dlogits = d/dz / T.
      for (int i = 0; i < cols; ++i) {
        const T logp_i = z[i] * inv_t - L;
        const T p = std::exp(logp_i);
        z[i] = (-gl * p - ge * p * (logp_i + H)) * inv_t;
      }
      const int32_t tg = targets[n];
      if (gl != T(0) && tg >= c0 && tg < c0 + cols) z[tg - c0] += gl * inv_t;
    }
    matmul_backward(dh, dW ? dW + static_cast<size_t>(c0) * C : static_cast<T*>(nullptr), scratch, h, Wc, N, C, cols);
  }
}

template void chunked_logprob_forward<float>(float*, float*, float*, const float*, const float*, const int32_t*, float,
                                             int, int, int, int, float*);
template void chunked_logprob_forward<double>(double*, double*, double*, const double*, const double*, const int32_t*,
                                              float, int, int, int, int, double*);
template void chunked_logprob_backward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                              const float*, const float*, const int32_t*, float, int, int, int, int,
                                              float*);
template void chunked_logprob_backward<double>(double*, double*, const double*, const double*, const double*,
                                               const double*, const double*, const double*, const int32_t*, float, int,
                                               int, int, int, double*);

}  // namespace troupe::kernels
