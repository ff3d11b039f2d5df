// MoE layer forward/backward (moe.h): router -> top-k -> dispatch -> per-expert SwiGLU -> combine.
// Invariant: the grouped path and the masked loop differ ONLY in how the (token, expert) rows are
// found (counting sort vs a scan per expert); rows, GEMM calls and every floating-point reduction
// are the same and in the same order, so both give bit-identical outputs and gradients.
#include "troupe/kernels/moe.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

namespace troupe::kernels {
namespace {

// int32 arrays live in the caller's float buffers (same size); placement-new starts their lifetime.
int32_t* ints_at(float* p, size_t n) { return new (p) int32_t[n]; }
const int32_t* ints_at(const float* p) { return std::launder(reinterpret_cast<const int32_t*>(p)); }

// Offsets (in floats) of the pieces of the saved buffer.
struct SavedLayout {
  size_t probs, weights, experts, offsets, row_slot, slot_row, g, u, y, gs, us, total;
};
SavedLayout saved_layout(const MoeConfig& c, int N) {
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  SavedLayout l{};
  size_t at = 0;
  auto take = [&](size_t count) {
    size_t here = at;
    at += count;
    return here;
  };
  l.probs = take(n * c.E);
  l.weights = take(nk);
  l.experts = take(nk);
  l.offsets = take(static_cast<size_t>(c.E) + 1);
  l.row_slot = take(nk);
  l.slot_row = take(nk);
  l.g = take(nk * c.H);
  l.u = take(nk * c.H);
  l.y = take(nk * c.C);
  l.gs = take(n * c.H_shared);
  l.us = take(n * c.H_shared);
  l.total = at;
  return l;
}

struct ForwardScratch {
  size_t xp, h, hs, counts, total;
};
ForwardScratch forward_scratch(const MoeConfig& c, int N) {
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  ForwardScratch s{};
  s.xp = 0;
  s.h = s.xp + nk * c.C;
  s.hs = s.h + nk * c.H;
  s.counts = s.hs + n * c.H_shared;
  s.total = s.counts + 2 * static_cast<size_t>(c.E);
  return s;
}

struct BackwardScratch {
  size_t xp, dyp, h, dg, du, dxp, dw, dp, hs, dgs, dus, rows, total;
};
BackwardScratch backward_scratch(const MoeConfig& c, int N) {
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  BackwardScratch s{};
  size_t at = 0;
  auto take = [&](size_t count) {
    size_t here = at;
    at += count;
    return here;
  };
  s.xp = take(nk * c.C);
  s.dyp = take(nk * c.C);
  s.h = take(nk * c.H);
  s.dg = take(nk * c.H);
  s.du = take(nk * c.H);
  s.dxp = take(nk * c.C);
  s.dw = take(nk);
  s.dp = take(n * c.E);
  s.hs = take(n * c.H_shared);
  s.dgs = take(n * c.H_shared);
  s.dus = take(n * c.H_shared);
  s.rows = take(nk);
  s.total = at;
  return s;
}

// Sequential sum (no reassociation), the same in both paths.
inline float dot_row(const float* a, const float* b, int C) {
  float acc = 0;
  for (int i = 0; i < C; ++i) acc += a[i] * b[i];
  return acc;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// ---- SwiGLU on a block of rows (shared by routed segments and the shared expert) ----------------
// g = X Wg^T, u = X Wu^T (n, H); h = silu(g) * u; y = h Wd^T (n, C). g, u kept for backward.
void swiglu_forward(float* y, float* g, float* u, float* h, const float* x, const float* wg, const float* wu,
                    const float* wd, int n, int C, int H) {
  if (n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, H, C, 1.0f, x, C, wg, C, 0.0f, g, H);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, H, C, 1.0f, x, C, wu, C, 0.0f, u, H);
  const size_t nh = static_cast<size_t>(n) * H;
  for (size_t i = 0; i < nh; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, C, H, 1.0f, h, H, wd, H, 0.0f, y, C);
}

// Backward of swiglu_forward. dWg/dWu/dWd accumulated; dx (n, C) assigned (or accumulated when
// dx_beta == 1). h, dg, du are (n, H) scratch.
void swiglu_backward(float* dx, float dx_beta, float* dwg, float* dwu, float* dwd, const float* dy,
                     const float* x, const float* g, const float* u, const float* wg, const float* wu,
                     const float* wd, float* h, float* dg, float* du, int n, int C, int H) {
  if (n == 0) return;
  const size_t nh = static_cast<size_t>(n) * H;
  for (size_t i = 0; i < nh; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, H, n, 1.0f, dy, C, h, H, 1.0f, dwd, H);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, H, C, 1.0f, dy, C, wd, H, 0.0f, dg, H);  // dh
  for (size_t i = 0; i < nh; ++i) {
    const float s = sigmoid(g[i]), dh = dg[i];
    du[i] = dh * g[i] * s;
    dg[i] = dh * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, C, n, 1.0f, dg, H, x, C, 1.0f, dwg, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, C, n, 1.0f, du, H, x, C, 1.0f, dwu, C);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, H, 1.0f, dg, H, wg, C, dx_beta, dx, C);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, H, 1.0f, du, H, wu, C, 1.0f, dx, C);
}

// ---- router ----------------------------------------------------------------------------------
// probs (N, E) = softmax(X Wr^T); experts/weights (N, K): the top-k (ties -> lower index), stored
// per token in ascending expert id so that "k order" equals "expert order" in every reduction.
void router_forward(float* probs, int32_t* experts, float* weights, const float* x, const float* wr,
                    const MoeConfig& c, int N) {
  const int E = c.E, K = c.K, C = c.C;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, E, C, 1.0f, x, C, wr, C, 0.0f, probs, E);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    float* p = probs + static_cast<size_t>(t) * E;
    float mx = p[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, p[e]);
    float sum = 0;
    for (int e = 0; e < E; ++e) {
      p[e] = std::exp(p[e] - mx);
      sum += p[e];
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; ++e) p[e] *= inv;
    int32_t* ex = experts + static_cast<size_t>(t) * K;
    float* w = weights + static_cast<size_t>(t) * K;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken = taken || ex[j] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;  // strict: ties keep the lower index
      }
      ex[k] = best;
    }
    std::sort(ex, ex + K);
    float s = 0;
    for (int k = 0; k < K; ++k) s += p[ex[k]];
    for (int k = 0; k < K; ++k) w[k] = c.renormalize ? p[ex[k]] / s : p[ex[k]];
  }
}

void router_stats(MoeStats* stats, const float* probs, const int32_t* offsets, const MoeConfig& c, int N) {
  if (!stats) return;
  *stats = MoeStats{};
  if (N == 0) return;
  std::vector<double> p_sum(static_cast<size_t>(c.E), 0.0);
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < c.E; ++e) p_sum[static_cast<size_t>(e)] += probs[static_cast<size_t>(t) * c.E + e];
  double aux = 0;
  for (int e = 0; e < c.E; ++e) {
    const int count = offsets[e + 1] - offsets[e];
    stats->max_expert_load = std::max(stats->max_expert_load, count);
    stats->empty_experts += count == 0 ? 1 : 0;
    aux += (static_cast<double>(count) / N) * (p_sum[static_cast<size_t>(e)] / N);
  }
  stats->aux_loss = static_cast<float>(c.E * aux);
}

// ---- dispatch -----------------------------------------------------------------------------------
// Masked: the rows of expert e, found by scanning every assignment; appended at `row`.
int scan_expert_rows(int32_t* row_slot, int32_t* slot_row, int e, int row, const int32_t* experts, int NK) {
  for (int s = 0; s < NK; ++s)
    if (experts[s] == e) {
      row_slot[row] = s;
      slot_row[s] = row;
      ++row;
    }
  return row;
}

// Routed experts over their segments [offsets[e], offsets[e+1]) of the permuted rows.
void experts_forward_grouped(float* y, float* g, float* u, float* h, const float* xp, const int32_t* offsets,
                             const MoeWeights& w, const MoeConfig& c) {
  const int C = c.C, H = c.H;
#pragma omp parallel for schedule(dynamic, 1)
  for (int e = 0; e < c.E; ++e) {
    const size_t r0 = static_cast<size_t>(offsets[e]);
    const int n = offsets[e + 1] - offsets[e];
    const size_t we = static_cast<size_t>(e) * H * C;
    swiglu_forward(y + r0 * C, g + r0 * H, u + r0 * H, h + r0 * H, xp + r0 * C, w.w_gate + we, w.w_up + we,
                   w.w_down + we, n, C, H);
  }
}

}  // namespace

void moe_route_plan(int32_t* offsets, int32_t* row_slot, int32_t* slot_row, int32_t* counts,
                    const int32_t* experts, int N, int K, int E) {
  const int NK = N * K;
  for (int e = 0; e < E; ++e) counts[e] = 0;
  for (int s = 0; s < NK; ++s) counts[experts[s]]++;
  offsets[0] = 0;
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  for (int e = 0; e < E; ++e) counts[e] = offsets[e];  // now the per-expert write cursor
  for (int s = 0; s < NK; ++s) {
    const int row = counts[experts[s]]++;
    row_slot[row] = s;
    slot_row[s] = row;
  }
}

void moe_permute(float* xp, const float* x, const int32_t* row_slot, int N, int K, int C) {
  const int NK = N * K;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < NK; ++r)
    std::memcpy(xp + static_cast<size_t>(r) * C, x + static_cast<size_t>(row_slot[r] / K) * C, sizeof(float) * C);
}

void moe_unpermute(float* out, const float* yp, const float* weights, const int32_t* slot_row, int N, int K, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    float* o = out + static_cast<size_t>(t) * C;
    for (int k = 0; k < K; ++k) {
      const int s = t * K + k;
      const float* yr = yp + static_cast<size_t>(slot_row[s]) * C;
      if (weights) {
        const float wk = weights[s];
        for (int i = 0; i < C; ++i) o[i] += wk * yr[i];
      } else {
        for (int i = 0; i < C; ++i) o[i] += yr[i];
      }
    }
  }
}

MoeRouting moe_saved_routing(const float* saved, const MoeConfig& cfg, int N) {
  const SavedLayout L = saved_layout(cfg, N);
  MoeRouting r;
  r.probs = saved + L.probs;
  r.experts = ints_at(saved + L.experts);
  r.weights = saved + L.weights;
  r.offsets = ints_at(saved + L.offsets);
  r.row_slot = ints_at(saved + L.row_slot);
  r.slot_row = ints_at(saved + L.slot_row);
  return r;
}

size_t moe_saved_floats(const MoeConfig& cfg, int N) { return saved_layout(cfg, N).total; }

size_t moe_scratch_floats(const MoeConfig& cfg, int N) {
  return std::max(forward_scratch(cfg, N).total, backward_scratch(cfg, N).total);
}

namespace {

// identity: the experts are the identity (y = x), for timing and testing the dispatch alone.
void forward_impl(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                  const MoeConfig& cfg, int N, float* scratch, bool identity) {
  const SavedLayout L = saved_layout(cfg, N);
  const ForwardScratch S = forward_scratch(cfg, N);
  const int E = cfg.E, K = cfg.K, C = cfg.C, H = cfg.H, NK = N * K;
  float* probs = saved + L.probs;
  float* weights = saved + L.weights;
  int32_t* experts = ints_at(saved + L.experts, static_cast<size_t>(NK));
  int32_t* offsets = ints_at(saved + L.offsets, static_cast<size_t>(E) + 1);
  int32_t* row_slot = ints_at(saved + L.row_slot, static_cast<size_t>(NK));
  int32_t* slot_row = ints_at(saved + L.slot_row, static_cast<size_t>(NK));
  float* g = saved + L.g;
  float* u = saved + L.u;
  float* y = saved + L.y;
  float* xp = scratch + S.xp;
  float* h = scratch + S.h;
  int32_t* cursor = ints_at(scratch + S.counts, 2 * static_cast<size_t>(E));

  if (N == 0) {
    for (int e = 0; e <= E; ++e) offsets[e] = 0;
    router_stats(stats, probs, offsets, cfg, N);
    return;
  }
  router_forward(probs, experts, weights, inp, w.w_router, cfg, N);

  // The shared expert (unweighted) is the starting value of every token's sum; else 0.
  if (cfg.H_shared > 0) {
    swiglu_forward(out, saved + L.gs, saved + L.us, scratch + S.hs, inp, w.ws_gate, w.ws_up, w.ws_down, N, C,
                   cfg.H_shared);
  } else {
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(N) * C);
  }

  if (cfg.grouped) {
    moe_route_plan(offsets, row_slot, slot_row, cursor, experts, N, K, E);
    moe_permute(xp, inp, row_slot, N, K, C);
    if (!identity) experts_forward_grouped(y, g, u, h, xp, offsets, w, cfg);
    moe_unpermute(out, identity ? xp : y, weights, slot_row, N, K, C);
  } else {
    // Masked loop: for every expert, scan all assignments, gather, compute, scatter.
    int row = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = row;
      const int end = scan_expert_rows(row_slot, slot_row, e, row, experts, NK);
      const int n = end - row;
#pragma omp parallel for schedule(static)
      for (int r = row; r < end; ++r)
        std::memcpy(xp + static_cast<size_t>(r) * C, inp + static_cast<size_t>(row_slot[r] / K) * C,
                    sizeof(float) * C);
      const size_t r0 = static_cast<size_t>(row), we = static_cast<size_t>(e) * H * C;
      if (!identity)
        swiglu_forward(y + r0 * C, g + r0 * H, u + r0 * H, h + r0 * H, xp + r0 * C, w.w_gate + we, w.w_up + we,
                       w.w_down + we, n, C, H);
      const float* yrows = identity ? xp : y;
      // Scatter; a token has each expert at most once, so rows of one expert touch distinct tokens.
#pragma omp parallel for schedule(static)
      for (int r = row; r < end; ++r) {
        const int s = row_slot[r];
        float* o = out + static_cast<size_t>(s / K) * C;
        const float wk = weights[s];
        const float* yr = yrows + static_cast<size_t>(r) * C;
        for (int i = 0; i < C; ++i) o[i] += wk * yr[i];
      }
      row = end;
    }
    offsets[E] = row;
  }
  router_stats(stats, probs, offsets, cfg, N);
}

void backward_impl(float* dinp, const MoeGrads& gr, const float* dout, float daux, const float* inp,
                   const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch,
                   bool identity) {
  const SavedLayout L = saved_layout(cfg, N);
  const BackwardScratch S = backward_scratch(cfg, N);
  const int E = cfg.E, K = cfg.K, C = cfg.C, H = cfg.H, NK = N * K;
  if (N == 0) return;
  const float* probs = saved + L.probs;
  const float* weights = saved + L.weights;
  const int32_t* experts = ints_at(saved + L.experts);
  const int32_t* offsets = ints_at(saved + L.offsets);
  const float* g = saved + L.g;
  const float* u = saved + L.u;
  const float* y = saved + L.y;
  float* xp = scratch + S.xp;
  float* dyp = scratch + S.dyp;
  float* h = scratch + S.h;
  float* dg = scratch + S.dg;
  float* du = scratch + S.du;
  float* dxp = scratch + S.dxp;
  float* dw = scratch + S.dw;
  float* dp = scratch + S.dp;

  // Shared expert first: its dx initializes dinp (same order in both paths).
  if (cfg.H_shared > 0) {
    swiglu_backward(dinp, 0.0f, gr.ws_gate, gr.ws_up, gr.ws_down, dout, inp, saved + L.gs, saved + L.us, w.ws_gate,
                    w.ws_up, w.ws_down, scratch + S.hs, scratch + S.dgs, scratch + S.dus, N, C, cfg.H_shared);
  } else {
    std::memset(dinp, 0, sizeof(float) * static_cast<size_t>(N) * C);
  }

  // d(out)/d(weight[t,k]) = <y_row, dout[t]>; the row's upstream gradient is weight * dout[t].
  // Identity experts: y_row is the token's input row.
  const int32_t* srow = ints_at(saved + L.slot_row);
  auto y_of = [&](int s) {
    return identity ? inp + static_cast<size_t>(s / K) * C : y + static_cast<size_t>(srow[s]) * C;
  };
  if (cfg.grouped) {
    const int32_t* row_slot = ints_at(saved + L.row_slot);
    const int32_t* slot_row = srow;
    // One fused pass over the permuted rows: gather x, scale dout, and d weight.
#pragma omp parallel for schedule(static)
    for (int r = 0; r < NK; ++r) {
      const int s = row_slot[r];
      const float* d = dout + static_cast<size_t>(s / K) * C;
      float* dr = dyp + static_cast<size_t>(r) * C;
      const float wk = weights[s];
      if (!identity)
        std::memcpy(xp + static_cast<size_t>(r) * C, inp + static_cast<size_t>(s / K) * C, sizeof(float) * C);
      for (int i = 0; i < C; ++i) dr[i] = wk * d[i];
      dw[s] = dot_row(y_of(s), d, C);
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < (identity ? 0 : E); ++e) {
      const size_t r0 = static_cast<size_t>(offsets[e]), we = static_cast<size_t>(e) * H * C;
      const int n = offsets[e + 1] - offsets[e];
      swiglu_backward(dxp + r0 * C, 0.0f, gr.w_gate + we, gr.w_up + we, gr.w_down + we, dyp + r0 * C, xp + r0 * C,
                      g + r0 * H, u + r0 * H, w.w_gate + we, w.w_up + we, w.w_down + we, h + r0 * H, dg + r0 * H,
                      du + r0 * H, n, C, H);
    }
    // Backward of the permute: each token gathers its K rows in ascending expert order.
    moe_unpermute(dinp, identity ? dyp : dxp, nullptr, slot_row, N, K, C);
  } else {
#pragma omp parallel for schedule(static)
    for (int s = 0; s < NK; ++s) dw[s] = dot_row(y_of(s), dout + static_cast<size_t>(s / K) * C, C);
    // Masked loop mirrored: per expert, rescan the assignments, gather, compute, scatter.
    int32_t* row_slot = ints_at(scratch + S.rows, static_cast<size_t>(NK));
    int row = 0;
    for (int e = 0; e < E; ++e) {
      int end = row;
      for (int s = 0; s < NK; ++s)
        if (experts[s] == e) row_slot[end++] = s;
      const int n = end - row;
#pragma omp parallel for schedule(static)
      for (int r = row; r < end; ++r) {
        const int s = row_slot[r];
        if (!identity)
          std::memcpy(xp + static_cast<size_t>(r) * C, inp + static_cast<size_t>(s / K) * C, sizeof(float) * C);
        const float* d = dout + static_cast<size_t>(s / K) * C;
        float* dr = dyp + static_cast<size_t>(r) * C;
        const float wk = weights[s];
        for (int i = 0; i < C; ++i) dr[i] = wk * d[i];
      }
      const size_t r0 = static_cast<size_t>(row), we = static_cast<size_t>(e) * H * C;
      if (!identity)
        swiglu_backward(dxp + r0 * C, 0.0f, gr.w_gate + we, gr.w_up + we, gr.w_down + we, dyp + r0 * C,
                        xp + r0 * C, g + r0 * H, u + r0 * H, w.w_gate + we, w.w_up + we, w.w_down + we, h + r0 * H,
                        dg + r0 * H, du + r0 * H, n, C, H);
#pragma omp parallel for schedule(static)
      for (int r = row; r < end; ++r) {
        float* o = dinp + static_cast<size_t>(row_slot[r] / K) * C;
        const float* dr = (identity ? dyp : dxp) + static_cast<size_t>(r) * C;
        for (int i = 0; i < C; ++i) o[i] += dr[i];
      }
      row = end;
    }
  }

  // Router: d weights -> d probs (renormalization, aux loss) -> d logits (softmax) -> dWr, dinp.
  const float aux_scale = daux * static_cast<float>(E) / (static_cast<float>(N) * static_cast<float>(N));
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    float* d = dp + static_cast<size_t>(t) * E;
    const float* p = probs + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; ++e) d[e] = daux != 0.0f ? aux_scale * static_cast<float>(offsets[e + 1] - offsets[e]) : 0.0f;
    const int32_t* ex = experts + static_cast<size_t>(t) * K;
    const float* dws = dw + static_cast<size_t>(t) * K;
    if (cfg.renormalize) {
      float s = 0, dot = 0;
      for (int k = 0; k < K; ++k) s += p[ex[k]];
      for (int k = 0; k < K; ++k) dot += dws[k] * weights[t * K + k];
      for (int k = 0; k < K; ++k) d[ex[k]] += (dws[k] - dot) / s;
    } else {
      for (int k = 0; k < K; ++k) d[ex[k]] += dws[k];
    }
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += d[e] * p[e];
    for (int e = 0; e < E; ++e) d[e] = p[e] * (d[e] - dot);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, C, N, 1.0f, dp, E, inp, C, 1.0f, gr.w_router, C);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, E, 1.0f, dp, E, w.w_router, C, 1.0f, dinp, C);
}

}  // namespace

void moe_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                 const MoeConfig& cfg, int N, float* scratch) {
  forward_impl(out, saved, stats, inp, w, cfg, N, scratch, false);
}

void moe_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                  const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch) {
  backward_impl(dinp, g, dout, daux, inp, saved, w, cfg, N, scratch, false);
}

void moe_dispatch_forward(float* out, float* saved, MoeStats* stats, const float* inp, const float* w_router,
                          const MoeConfig& cfg, int N, float* scratch) {
  MoeConfig c = cfg;
  c.H_shared = 0;
  MoeWeights w;
  w.w_router = w_router;
  forward_impl(out, saved, stats, inp, w, c, N, scratch, true);
}

void moe_dispatch_backward(float* dinp, float* dw_router, const float* dout, float daux, const float* inp,
                           const float* saved, const float* w_router, const MoeConfig& cfg, int N, float* scratch) {
  MoeConfig c = cfg;
  c.H_shared = 0;
  MoeWeights w;
  w.w_router = w_router;
  MoeGrads g;
  g.w_router = dw_router;
  backward_impl(dinp, g, dout, daux, inp, saved, w, c, N, scratch, true);
}

}  // namespace troupe::kernels
