// The attention helpers the tile bodies (flash_attention.h) share, the KV cache write, and the
// one-thread-per-(sequence, head) decode body attention.cu falls back to when its queue has no
// split-K workspace; decode walks its keys with the CPU reference's online softmax (ops.h
// attention_forward_reference). A token finds its sequence by binary search in cu_seqlens.
#pragma once

#include "lanes.h"

namespace troupe::kernels::cuda {

// The sequence s of token t: cu_seqlens[s] <= t < cu_seqlens[s+1] (empty sequences skipped).
TROUPE_HD inline int sequence_of(const int32_t* cu_seqlens, int S, int t) {
  int lo = 0, hi = S;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu_seqlens[mid] <= t) lo = mid; else hi = mid;
  }
  return lo;
}

template <class T>
TROUPE_HD inline T dot_hd(const T* a, const T* b, int n) {
  T s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// One key of an online softmax (o holds sum e^(s-m) v, m the largest score, l = sum e^(s-m)).
TROUPE_HD inline void online_step(float* o, float& m, float& l, float s, const float* vv, int HD) {
  if (s > m) {
    const float r = hd_exp(m - s);
    l *= r;
    for (int d = 0; d < HD; ++d) o[d] *= r;
    m = s;
  }
  const float w = hd_exp(s - m);
  l += w;
  for (int d = 0; d < HD; ++d) o[d] += w * vv[d];
}

struct AttnGrads {
  const float* dout;
  const float* q;
  const float* k;
  const float* v;
  const float* out;
  const float* lse;
};

struct AttnDecodeBody {  // over B*NH
  float* out;
  const float* q;
  const float* k_cache;
  const float* v_cache;
  const int32_t* kv_len;
  const int32_t* slot;
  int cache_len, NH, NKV, HD;
  TROUPE_HD void operator()(size_t bh) const {
    const int group = NH / NKV;
    const int b = static_cast<int>(bh / NH), h = static_cast<int>(bh % NH), g = h / group;
    const float scale = 1.0f / hd_sqrt(static_cast<float>(HD));
    const float* qv = q + bh * HD;
    float* o = out + bh * HD;
    for (int d = 0; d < HD; ++d) o[d] = 0.0f;
    float m = hd_neg_inf(), l = 0;
    const size_t stride = static_cast<size_t>(NKV) * HD;
    const size_t first = (static_cast<size_t>(slot ? slot[b] : b) * cache_len * NKV + g) * HD;
    for (int j = 0; j < kv_len[b]; ++j)
      online_step(o, m, l, dot_hd(qv, k_cache + first + j * stride, HD) * scale, v_cache + first + j * stride, HD);
    if (l > 0) {
      const float inv = 1.0f / l;
      for (int d = 0; d < HD; ++d) o[d] *= inv;
    }
  }
};

struct KvWriteBody {  // over T*KD
  float* k_cache;
  float* v_cache;
  const float* k;
  const float* v;
  const int32_t* slot;
  const int32_t* pos;
  int cache_len, KD;
  TROUPE_HD void operator()(size_t i) const {
    const size_t t = i / static_cast<size_t>(KD), d = i % static_cast<size_t>(KD);
    const size_t row = (static_cast<size_t>(slot[t]) * cache_len + pos[t]) * KD;
    k_cache[row + d] = k[i];
    v_cache[row + d] = v[i];
  }
};

}  // namespace troupe::kernels::cuda
