// Kernel bodies of the log-softmax family (logprob.cu): log-prob of the target and entropy under
// softmax(logits / temperature), whole-vocabulary rows and the chunked LM head's per-chunk fold
// (an online max / sum e^(z-m) / sum e^(z-m) z per row, rescaled when a chunk raises the max).
// One block per row; the chunk logits come from a cuBLAS GEMM the launcher runs first.
#pragma once

#include "lanes.h"

namespace troupe::kernels::cuda {

struct LogprobForwardBody {
  float* logp;
  float* entropy;
  float* lse;
  const float* logits;
  const int32_t* targets;
  float inv_t;
  int V;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int n) const {
    const float* z = logits + static_cast<size_t>(n) * V;
    float m = hd_neg_inf();
    for (int i = L.lane(); i < V; i += L.count()) m = hd_max(m, z[i] * inv_t);
    m = L.max(m);
    float s = 0, sz = 0;
    for (int i = L.lane(); i < V; i += L.count()) {
      const float zi = z[i] * inv_t;
      const float e = hd_exp(zi - m);
      s += e;
      sz += e * zi;
    }
    s = L.sum(s);
    sz = L.sum(sz);
    if (L.lane() == 0) {
      const float Ls = m + hd_log(s);
      lse[n] = Ls;
      entropy[n] = Ls - sz / s;
      logp[n] = targets[n] >= 0 ? z[targets[n]] * inv_t - Ls : 0.0f;
    }
  }
};

// d logp / dz_i = [i == target] - p_i;  d H / dz_i = -p_i (log p_i + H); d/dlogits = d/dz / T.
// In place (dlogits == logits) allowed: each element is read before it is written, by one lane.
struct LogprobBackwardBody {
  float* dlogits;
  const float* dlogp;
  const float* dentropy;
  const float* logits;
  const float* lse;
  const int32_t* targets;
  float inv_t;
  int V;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int n) const {
    const float* z = logits + static_cast<size_t>(n) * V;
    float* dz = dlogits + static_cast<size_t>(n) * V;
    const float Ls = lse[n];
    const float gl = (dlogp && targets[n] >= 0) ? dlogp[n] : 0.0f;
    const float ge = dentropy ? dentropy[n] : 0.0f;
    float H = 0;
    if (ge != 0.0f) {
      float sz = 0;
      for (int i = L.lane(); i < V; i += L.count()) sz += hd_exp(z[i] * inv_t - Ls) * z[i] * inv_t;
      H = Ls - L.sum(sz);
    }
    for (int i = L.lane(); i < V; i += L.count()) {
      const float logp_i = z[i] * inv_t - Ls;
      const float p = hd_exp(logp_i);
      const float g = -gl * p - ge * p * (logp_i + H);
      dz[i] = g * inv_t;
      if (gl != 0.0f && i == targets[n]) dz[i] += gl * inv_t;
    }
  }
};

// Chunked forward state per row, kept in the outputs and one extra array: lse = running max,
// entropy = running sum e^(z-m) z, sum = running sum e^(z-m), logp = z[target].
struct ChunkInitBody {
  float* logp;
  float* entropy;
  float* lse;
  float* sum;
  TROUPE_HD void operator()(size_t n) const {
    lse[n] = hd_neg_inf();
    entropy[n] = 0.0f;
    logp[n] = 0.0f;
    sum[n] = 0.0f;
  }
};

struct ChunkFoldBody {  // one row of a chunk's logits z (N, cols), vocabulary columns [c0, c0+cols)
  float* logp;
  float* entropy;
  float* lse;
  float* sum;
  const float* zc;
  const int32_t* targets;
  float inv_t;
  int cols, c0;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int n) const {
    const float* z = zc + static_cast<size_t>(n) * cols;
    float m = lse[n];
    float cm = hd_neg_inf();
    for (int i = L.lane(); i < cols; i += L.count()) cm = hd_max(cm, z[i] * inv_t);
    cm = L.max(cm);
    float s = 0, sz = 0;
    if (cm > m) m = cm;
    for (int i = L.lane(); i < cols; i += L.count()) {
      const float zi = z[i] * inv_t;
      const float e = hd_exp(zi - m);
      s += e;
      sz += e * zi;
    }
    s = L.sum(s);
    sz = L.sum(sz);
    if (L.lane() == 0) {
      float ps = sum[n], psz = entropy[n];
      if (cm > lse[n]) {  // a larger max: rescale what the earlier chunks summed
        const float r = hd_exp(lse[n] - cm);
        ps *= r;
        psz *= r;
      }
      lse[n] = m;
      sum[n] = ps + s;
      entropy[n] = psz + sz;
      const int32_t tg = targets[n];
      if (tg >= c0 && tg < c0 + cols) logp[n] = z[tg - c0] * inv_t;
    }
  }
};

struct ChunkFinishBody {
  float* logp;
  float* entropy;
  float* lse;
  const float* sum;
  const int32_t* targets;
  TROUPE_HD void operator()(size_t n) const {
    const float Ls = lse[n] + hd_log(sum[n]);
    entropy[n] = Ls - entropy[n] / sum[n];
    logp[n] = targets[n] >= 0 ? logp[n] - Ls : 0.0f;
    lse[n] = Ls;
  }
};

struct ChunkBackwardBody {  // over N*cols: z (logits in, d/dlogits out)
  float* zc;
  const float* dlogp;
  const float* dentropy;
  const float* lse;
  const float* entropy;
  const int32_t* targets;
  float inv_t;
  int cols, c0;
  TROUPE_HD void operator()(size_t j) const {
    const size_t n = j / static_cast<size_t>(cols);
    const int i = static_cast<int>(j % static_cast<size_t>(cols));
    const float Ls = lse[n];
    const float gl = (dlogp && targets[n] >= 0) ? dlogp[n] : 0.0f;
    const float ge = dentropy ? dentropy[n] : 0.0f;
    const float H = ge != 0.0f ? entropy[n] : 0.0f;
    const float logp_i = zc[j] * inv_t - Ls;
    const float p = hd_exp(logp_i);
    float g = (-gl * p - ge * p * (logp_i + H)) * inv_t;
    if (gl != 0.0f && targets[n] == c0 + i) g += gl * inv_t;
    zc[j] = g;
  }
};

}  // namespace troupe::kernels::cuda
