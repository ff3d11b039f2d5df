// Kernel bodies of MoE routing and dispatch (moe_route.cu): the router's softmax and top-k per
// token (experts stored ascending, ties to the lower index, as moe.h requires), the inverse of the
// expert-sorted row order, permute / unpermute+combine, and the per-row pieces of the experts'
// backward. The histogram, scan and stable sort by expert are CUB's (moe_route.cu); these bodies
// are what runs between and after them.
#pragma once

#include "lanes.h"

namespace troupe::kernels::cuda {

struct RouterTopkBody {  // over N tokens; probs (N, E) holds the router logits on entry
  float* probs;
  int32_t* experts;
  float* weights;
  int E, K;
  bool renormalize;
  TROUPE_HD void operator()(size_t t) const {
    float* p = probs + t * E;
    float mx = p[0];
    for (int e = 1; e < E; ++e) mx = hd_max(mx, p[e]);
    float sum = 0;
    for (int e = 0; e < E; ++e) {
      p[e] = hd_exp(p[e] - mx);
      sum += p[e];
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; ++e) p[e] *= inv;
    int32_t* ex = experts + t * K;
    float* w = weights + t * K;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken = taken || ex[j] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;  // strict: ties keep the lower index
      }
      ex[k] = best;
    }
    for (int i = 1; i < K; ++i)  // ascending expert id (insertion sort, K is small)
      for (int j = i; j > 0 && ex[j - 1] > ex[j]; --j) {
        const int32_t x = ex[j];
        ex[j] = ex[j - 1];
        ex[j - 1] = x;
      }
    float s = 0;
    for (int k = 0; k < K; ++k) s += p[ex[k]];
    for (int k = 0; k < K; ++k) w[k] = renormalize ? p[ex[k]] / s : p[ex[k]];
  }
};

struct IotaBody {
  int32_t* x;
  TROUPE_HD void operator()(size_t i) const { x[i] = static_cast<int32_t>(i); }
};

struct InvertRowsBody {  // over N*K rows: slot_row[row_slot[r]] = r
  int32_t* slot_row;
  const int32_t* row_slot;
  TROUPE_HD void operator()(size_t r) const { slot_row[row_slot[r]] = static_cast<int32_t>(r); }
};

struct PermuteBody {  // over N*K*C: xp[slot_row[s]] = x[s / K]
  float* xp;
  const float* x;
  const int32_t* slot_row;
  int K, C;
  TROUPE_HD void operator()(size_t i) const {
    const size_t s = i / static_cast<size_t>(C), c = i % static_cast<size_t>(C);
    xp[static_cast<size_t>(slot_row[s]) * C + c] = x[(s / static_cast<size_t>(K)) * C + c];
  }
};

struct PermuteWeightsBody {  // over N*K: w_row[slot_row[s]] = weights[s]
  float* w_row;
  const float* weights;
  const int32_t* slot_row;
  TROUPE_HD void operator()(size_t s) const { w_row[slot_row[s]] = weights[s]; }
};

struct UnpermuteBody {  // over N*C: out[t] (+)= sum_k w[t,k] yp[slot_row[t*K+k]], k ascending
  float* out;
  const float* yp;
  const float* weights;  // null: 1
  const int32_t* slot_row;
  int K, C;
  bool accumulate;
  TROUPE_HD void operator()(size_t i) const {
    const size_t t = i / static_cast<size_t>(C), c = i % static_cast<size_t>(C);
    float acc = accumulate ? out[i] : 0.0f;
    for (int k = 0; k < K; ++k) {
      const size_t s = t * K + k;
      const float y = yp[static_cast<size_t>(slot_row[s]) * C + c];
      acc += weights ? weights[s] * y : y;
    }
    out[i] = acc;
  }
};

// The backward of an expert's SwiGLU from dh (in dg): du (into h) and dg, over n*H.
struct SwigluDhBody {
  float* h;
  float* dg;
  const float* g;
  const float* u;
  TROUPE_HD void operator()(size_t i) const {
    const float s = 1.0f / (1.0f + hd_exp(-g[i])), dh = dg[i];
    h[i] = dh * g[i] * s;
    dg[i] = dh * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
};

// Routed row r (one block): d weight_r = <h_r, q_r>, then h_r *= w_r (for dWd) and q_r *= w_r (dh).
struct WeightedRowBody {
  float* h;
  float* q;
  float* dw_row;
  const float* w_row;
  int H;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int r) const {
    float* hr = h + static_cast<size_t>(r) * H;
    float* qr = q + static_cast<size_t>(r) * H;
    float d = 0;
    for (int i = L.lane(); i < H; i += L.count()) d += hr[i] * qr[i];
    d = L.sum(d);
    L.sync();
    const float wr = w_row[r];
    for (int i = L.lane(); i < H; i += L.count()) {
      hr[i] *= wr;
      qr[i] *= wr;
    }
    if (L.lane() == 0) dw_row[r] = d;
  }
};

// Router backward per token: d weights -> d probs (renormalization, aux loss) -> d logits.
struct RouterBackwardBody {  // over N tokens; dp (N, E) out
  float* dp;
  const float* probs;
  const float* weights;
  const int32_t* experts;
  const int32_t* offsets;
  const int32_t* slot_row;
  const float* dw;  // per row
  float daux, aux_scale;
  int E, K;
  bool renormalize;
  TROUPE_HD void operator()(size_t t) const {
    float* d = dp + t * E;
    const float* p = probs + t * E;
    for (int e = 0; e < E; ++e)
      d[e] = daux != 0.0f ? aux_scale * static_cast<float>(offsets[e + 1] - offsets[e]) : 0.0f;
    const int32_t* ex = experts + t * K;
    if (renormalize) {
      float s = 0, dot = 0;
      for (int k = 0; k < K; ++k) s += p[ex[k]];
      for (int k = 0; k < K; ++k) dot += dw[slot_row[t * K + k]] * weights[t * K + k];
      for (int k = 0; k < K; ++k) d[ex[k]] += (dw[slot_row[t * K + k]] - dot) / s;
    } else {
      for (int k = 0; k < K; ++k) d[ex[k]] += dw[slot_row[t * K + k]];
    }
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += d[e] * p[e];
    for (int e = 0; e < E; ++e) d[e] = p[e] * (d[e] - dot);
  }
};

}  // namespace troupe::kernels::cuda
