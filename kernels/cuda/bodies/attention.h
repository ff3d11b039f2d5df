// Kernel bodies of causal grouped-query attention over packed sequences (attention.cu): one thread
// per (query token, head) for the forward and dq, one per (key token, kv head) for dk/dv (one
// writer per output row, no atomics), one per (sequence, head) for decode; each walks its keys
// with the CPU reference's online softmax (ops.h attention_forward_reference). A token finds its
// sequence by binary search in cu_seqlens, so no per-token metadata is needed; the softmax-backward
// row term D = <dout, out> is recomputed where it is used, so the backward needs no scratch.
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

struct AttnShape {
  const int32_t* cu_seqlens;
  int S, NH, NKV, HD;
  TROUPE_HD float scale() const { return 1.0f / hd_sqrt(static_cast<float>(HD)); }
};

struct AttnForwardBody {  // over N*NH
  float* out;
  float* lse;
  const float* q;
  const float* k;
  const float* v;
  AttnShape sh;
  TROUPE_HD void operator()(size_t th) const {
    const int NH = sh.NH, NKV = sh.NKV, HD = sh.HD, group = NH / NKV;
    const int t = static_cast<int>(th / NH), h = static_cast<int>(th % NH), g = h / group;
    const int a = sh.cu_seqlens[sequence_of(sh.cu_seqlens, sh.S, t)];
    const float scale = sh.scale();
    const float* qv = q + th * HD;
    float* o = out + th * HD;
    for (int d = 0; d < HD; ++d) o[d] = 0.0f;
    float m = hd_neg_inf(), l = 0;
    for (int j = a; j <= t; ++j) {
      const float* kv = k + (static_cast<size_t>(j) * NKV + g) * HD;
      const float* vv = v + (static_cast<size_t>(j) * NKV + g) * HD;
      online_step(o, m, l, dot_hd(qv, kv, HD) * scale, vv, HD);
    }
    const float inv = 1.0f / l;
    for (int d = 0; d < HD; ++d) o[d] *= inv;
    lse[th] = m + hd_log(l);
  }
};

struct AttnGrads {
  const float* dout;
  const float* q;
  const float* k;
  const float* v;
  const float* out;
  const float* lse;
};

struct AttnBackwardDqBody {  // over N*NH
  float* dq;
  AttnGrads in;
  AttnShape sh;
  TROUPE_HD void operator()(size_t th) const {
    const int NH = sh.NH, NKV = sh.NKV, HD = sh.HD, group = NH / NKV;
    const int t = static_cast<int>(th / NH), h = static_cast<int>(th % NH), g = h / group;
    const int a = sh.cu_seqlens[sequence_of(sh.cu_seqlens, sh.S, t)];
    const float scale = sh.scale();
    const float* qv = in.q + th * HD;
    const float* dov = in.dout + th * HD;
    const float D = dot_hd(dov, in.out + th * HD, HD);
    float* dqv = dq + th * HD;
    for (int d = 0; d < HD; ++d) dqv[d] = 0.0f;
    for (int j = a; j <= t; ++j) {
      const float* kv = in.k + (static_cast<size_t>(j) * NKV + g) * HD;
      const float* vv = in.v + (static_cast<size_t>(j) * NKV + g) * HD;
      const float p = hd_exp(dot_hd(qv, kv, HD) * scale - in.lse[th]);
      const float ds = p * (dot_hd(dov, vv, HD) - D) * scale;
      for (int d = 0; d < HD; ++d) dqv[d] += ds * kv[d];
    }
  }
};

struct AttnBackwardDkDvBody {  // over N*NKV
  float* dk;
  float* dv;
  AttnGrads in;
  AttnShape sh;
  TROUPE_HD void operator()(size_t jg) const {
    const int NH = sh.NH, NKV = sh.NKV, HD = sh.HD, group = NH / NKV;
    const int j = static_cast<int>(jg / NKV), g = static_cast<int>(jg % NKV);
    const int e = sh.cu_seqlens[sequence_of(sh.cu_seqlens, sh.S, j) + 1];
    const float scale = sh.scale();
    const float* kv = in.k + jg * HD;
    const float* vv = in.v + jg * HD;
    float* dkv = dk + jg * HD;
    float* dvv = dv + jg * HD;
    for (int d = 0; d < HD; ++d) dkv[d] = dvv[d] = 0.0f;
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int t = j; t < e; ++t) {
        const size_t th = static_cast<size_t>(t) * NH + h;
        const float* qv = in.q + th * HD;
        const float* dov = in.dout + th * HD;
        const float D = dot_hd(dov, in.out + th * HD, HD);
        const float p = hd_exp(dot_hd(qv, kv, HD) * scale - in.lse[th]);
        const float ds = p * (dot_hd(dov, vv, HD) - D) * scale;
        for (int d = 0; d < HD; ++d) {
          dvv[d] += p * dov[d];
          dkv[d] += ds * qv[d];
        }
      }
    }
  }
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
