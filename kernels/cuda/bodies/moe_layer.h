// The MoE layer's launch sequence (moe.h's grouped path) written once over an executor, so the
// CUDA backend runs it with cuBLAS and CUB (moe_route.cu's DeviceExec) and the host test runs the
// very same sequence with host GEMMs and host_grid.h (HostExec in the test). An Exec provides:
//   gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)   row-major, as ops.h gemm_blocked
//   gemm_batch(std::vector<RowMajorGemm>)                         independent GEMMs of one phase (the
//                                                                 experts' segments), in any order
//   each(body, n), rows(body, nrows)                              element and row kernels
//   zero(ptr, bytes), to_host(host_dst, src, bytes)               (to_host waits for the queue)
//   route_plan(offsets, row_slot, experts, NK, E, tmp, tmp_bytes) expert histogram, exclusive scan
//                                                                 and stable sort of the slots by expert
//   plan_tmp_bytes(NK, E)                                         bytes route_plan needs
// Saved buffer: the CPU layout (moe_saved_routing reads it); scratch: this file's layouts.
#pragma once

#include <algorithm>
#include <vector>

#include "elementwise.h"
#include "gemm_args.h"
#include "moe.h"
#include "troupe/kernels/moe.h"

namespace troupe::kernels::cuda {

struct MoeSwigluBody {  // h = g * sigmoid(g) * u, as the CPU experts compute it
  float* h;
  const float* g;
  const float* u;
  TROUPE_HD void operator()(size_t i) const { h[i] = g[i] * (1.0f / (1.0f + hd_exp(-g[i]))) * u[i]; }
};

struct MoeSavedLayout {
  size_t probs, weights, experts, offsets, row_slot, slot_row, g, u, gs, us, total;
};
inline MoeSavedLayout moe_saved_layout(const MoeConfig& c, int N) {
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  MoeSavedLayout L{};
  size_t at = 0;
  auto put = [&at](size_t& f, size_t count) { f = at, at += count; };
  put(L.probs, n * c.E), put(L.weights, nk), put(L.experts, nk), put(L.offsets, static_cast<size_t>(c.E) + 1);
  put(L.row_slot, nk), put(L.slot_row, nk), put(L.g, nk * c.H), put(L.u, nk * c.H);
  put(L.gs, n * c.H_shared), put(L.us, n * c.H_shared);
  L.total = at;
  return L;
}

// Scratch: forward and backward pieces share one buffer (a call uses one set), then the plan's
// temporary storage (floats, rounded up).
struct MoeScratchLayout {
  size_t xp, yp, h, hs, dop, dg, dw, wrow, dp, dgs, plan, total;
};
inline MoeScratchLayout moe_scratch_layout(const MoeConfig& c, int N, size_t plan_bytes) {
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  MoeScratchLayout L{};
  size_t at = 0;
  auto put = [&at](size_t& f, size_t count) { f = at, at += (count + 1) / 2 * 2; };  // 8-byte aligned pieces
  put(L.xp, nk * c.C), put(L.yp, nk * c.C), put(L.h, nk * c.H), put(L.hs, n * c.H_shared);
  put(L.dop, nk * c.C), put(L.dg, nk * c.H), put(L.dw, nk), put(L.wrow, nk), put(L.dp, n * c.E);
  put(L.dgs, n * c.H_shared), put(L.plan, (plan_bytes + sizeof(float) - 1) / sizeof(float));
  L.total = at;
  return L;
}

inline int32_t* moe_ints(float* p) { return reinterpret_cast<int32_t*>(p); }
inline const int32_t* moe_ints(const float* p) { return reinterpret_cast<const int32_t*>(p); }

// g = X Wg^T, u = X Wu^T (n, H); h = silu(g) u; y = h Wd^T (n, C).
template <class Exec>
void moe_expert_forward(Exec& ex, float* y, float* g, float* u, float* h, const float* x, const float* wg,
                        const float* wu, const float* wd, int n, int C, int H) {
  if (n == 0) return;
  ex.gemm(false, true, n, H, C, 1.0f, x, C, wg, C, 0.0f, g, H);
  ex.gemm(false, true, n, H, C, 1.0f, x, C, wu, C, 0.0f, u, H);
  ex.each(MoeSwigluBody{h, g, u}, static_cast<size_t>(n) * H);
  ex.gemm(false, true, n, C, H, 1.0f, h, H, wd, H, 0.0f, y, C);
}

// From dh (in dg): du (in h), dg; dWg += dg^T x, dWu += du^T x; dx = dg Wg + du Wu (dx may be x).
template <class Exec>
void moe_expert_backward_from_dh(Exec& ex, float* dx, float* dwg, float* dwu, float* h, float* dg, const float* g,
                                 const float* u, const float* x, const float* wg, const float* wu, int n, int C,
                                 int H) {
  ex.each(SwigluDhBody{h, dg, g, u}, static_cast<size_t>(n) * H);
  ex.gemm(true, false, H, C, n, 1.0f, dg, H, x, C, 1.0f, dwg, C);
  ex.gemm(true, false, H, C, n, 1.0f, h, H, x, C, 1.0f, dwu, C);
  ex.gemm(false, false, n, C, H, 1.0f, dg, H, wg, C, 0.0f, dx, C);
  ex.gemm(false, false, n, C, H, 1.0f, h, H, wu, C, 1.0f, dx, C);
}

inline void moe_host_stats(MoeStats* stats, const std::vector<float>& probs, const std::vector<int32_t>& offsets,
                           const MoeConfig& c, int N) {
  *stats = MoeStats{};
  if (N == 0) return;
  std::vector<double> p_sum(static_cast<size_t>(c.E), 0.0);
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < c.E; ++e) p_sum[static_cast<size_t>(e)] += probs[static_cast<size_t>(t) * c.E + e];
  double aux = 0;
  for (int e = 0; e < c.E; ++e) {
    const int count = offsets[static_cast<size_t>(e) + 1] - offsets[static_cast<size_t>(e)];
    stats->max_expert_load = std::max(stats->max_expert_load, count);
    stats->empty_experts += count == 0 ? 1 : 0;
    aux += (static_cast<double>(count) / N) * (p_sum[static_cast<size_t>(e)] / N);
  }
  stats->aux_loss = static_cast<float>(c.E * aux);
}

// The layer up to its routed experts, on N > 0 tokens: router GEMM, softmax and top-k, the shared
// expert (its output starts `out`), the route plan and the permute of the rows' inputs into xp
// (N K, C). hs (N, H_shared) and plan (plan_bytes) are scratch. Returns the plan's offsets (E + 1)
// on the host.
template <class Exec>
std::vector<int32_t> moe_route_and_permute(Exec& ex, float* out, float* saved, const float* inp, const MoeWeights& w,
                                           const MoeConfig& cfg, int N, float* xp, float* hs, float* plan,
                                           size_t plan_bytes) {
  const int E = cfg.E, K = cfg.K, C = cfg.C, NK = N * K;
  const MoeSavedLayout L = moe_saved_layout(cfg, N);
  float* probs = saved + L.probs;
  int32_t* experts = moe_ints(saved + L.experts);
  int32_t* offsets = moe_ints(saved + L.offsets);
  int32_t* row_slot = moe_ints(saved + L.row_slot);
  int32_t* slot_row = moe_ints(saved + L.slot_row);
  ex.gemm(false, true, N, E, C, 1.0f, inp, C, w.w_router, C, 0.0f, probs, E);
  ex.each(RouterTopkBody{probs, experts, saved + L.weights, E, K, cfg.renormalize}, static_cast<size_t>(N));
  if (cfg.H_shared > 0)
    moe_expert_forward(ex, out, saved + L.gs, saved + L.us, hs, inp, w.ws_gate, w.ws_up, w.ws_down, N, C,
                       cfg.H_shared);
  ex.route_plan(offsets, row_slot, experts, NK, E, plan, plan_bytes);
  ex.each(InvertRowsBody{slot_row, row_slot}, static_cast<size_t>(NK));
  ex.each(PermuteBody{xp, inp, slot_row, K, C}, static_cast<size_t>(NK) * C);
  std::vector<int32_t> off(static_cast<size_t>(E) + 1);
  ex.to_host(off.data(), offsets, sizeof(int32_t) * off.size());
  return off;
}

// The layer after its routed experts: out (+)= the rows' outputs y (N K, C) weighted and combined
// per token (assigned without a shared expert), and the router statistics on the host.
template <class Exec>
void moe_combine_and_stats(Exec& ex, float* out, MoeStats* stats, const float* y, const float* saved,
                           const std::vector<int32_t>& off, const MoeConfig& cfg, int N) {
  const MoeSavedLayout L = moe_saved_layout(cfg, N);
  ex.each(UnpermuteBody{out, y, saved + L.weights, moe_ints(saved + L.slot_row), cfg.K, cfg.C, cfg.H_shared > 0},
          static_cast<size_t>(N) * cfg.C);
  if (stats) {
    std::vector<float> p(static_cast<size_t>(N) * cfg.E);
    ex.to_host(p.data(), saved + L.probs, sizeof(float) * p.size());
    moe_host_stats(stats, p, off, cfg, N);
  }
}

template <class Exec>
void moe_layer_forward(Exec& ex, float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                       const MoeConfig& cfg, int N, float* scratch) {
  const int E = cfg.E, K = cfg.K, C = cfg.C, H = cfg.H, NK = N * K;
  const MoeSavedLayout L = moe_saved_layout(cfg, N);
  const size_t plan_bytes = ex.plan_tmp_bytes(NK, E);
  const MoeScratchLayout S = moe_scratch_layout(cfg, N, plan_bytes);
  if (N == 0) {
    ex.zero(saved + L.offsets, sizeof(int32_t) * (static_cast<size_t>(E) + 1));
    if (stats) *stats = MoeStats{};
    return;
  }
  float* xp = scratch + S.xp;
  float* y = scratch + S.yp;
  const std::vector<int32_t> off =
      moe_route_and_permute(ex, out, saved, inp, w, cfg, N, xp, scratch + S.hs, scratch + S.plan, plan_bytes);
  // The routed experts phase by phase: each phase is one GEMM per non-empty segment, issued as one
  // batch (ex.gemm_batch: grouped, on streams or one by one); the elementwise SwiGLU runs once over
  // all NK rows, since the segments tile them.
  float* g = saved + L.g;
  float* u = saved + L.u;
  float* h = scratch + S.h;
  std::vector<RowMajorGemm> gate_up, down;
  for (int e = 0; e < E; ++e) {
    const size_t r0 = static_cast<size_t>(off[static_cast<size_t>(e)]), we = static_cast<size_t>(e) * H * C;
    const int n = off[static_cast<size_t>(e) + 1] - off[static_cast<size_t>(e)];
    if (n == 0) continue;
    gate_up.push_back({false, true, n, H, C, 1.0f, xp + r0 * C, C, w.w_gate + we, C, 0.0f, g + r0 * H, H});
    gate_up.push_back({false, true, n, H, C, 1.0f, xp + r0 * C, C, w.w_up + we, C, 0.0f, u + r0 * H, H});
    down.push_back({false, true, n, C, H, 1.0f, h + r0 * H, H, w.w_down + we, H, 0.0f, y + r0 * C, C});
  }
  ex.gemm_batch(gate_up);
  ex.each(MoeSwigluBody{h, g, u}, static_cast<size_t>(NK) * H);
  ex.gemm_batch(down);
  moe_combine_and_stats(ex, out, stats, y, saved, off, cfg, N);
}

// The shared expert's backward on N > 0 tokens: its weight gradients accumulated, its dx assigned
// to dinp (so it must run first). hs, dgs (N, H_shared) scratch. Nothing without a shared expert.
template <class Exec>
void moe_shared_expert_backward(Exec& ex, float* dinp, const MoeGrads& gr, const float* dout, const float* inp,
                                const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* hs,
                                float* dgs) {
  if (cfg.H_shared <= 0) return;
  const int C = cfg.C, Hs = cfg.H_shared;
  const MoeSavedLayout L = moe_saved_layout(cfg, N);
  ex.each(MoeSwigluBody{hs, saved + L.gs, saved + L.us}, static_cast<size_t>(N) * Hs);
  ex.gemm(true, false, C, Hs, N, 1.0f, dout, C, hs, Hs, 1.0f, gr.ws_down, Hs);
  ex.gemm(false, false, N, Hs, C, 1.0f, dout, C, w.ws_down, Hs, 0.0f, dgs, Hs);
  moe_expert_backward_from_dh(ex, dinp, gr.ws_gate, gr.ws_up, hs, dgs, saved + L.gs, saved + L.us, inp, w.ws_gate,
                              w.ws_up, N, C, Hs);
}

// The layer's backward after its routed experts: dinp (+)= each token's rows' dx (dxrows, N K rows
// of C; assigned without a shared expert), then the router's backward from the rows' d weights dw
// (N K): d probs and d logits into dp (N, E), dWr += dp^T inp, dinp += dp Wr.
template <class Exec>
void moe_router_backward(Exec& ex, float* dinp, const MoeGrads& gr, const float* dxrows, const float* dw, float* dp,
                         float daux, const float* inp, const float* saved, const MoeWeights& w, const MoeConfig& cfg,
                         int N) {
  const int E = cfg.E, K = cfg.K, C = cfg.C;
  const MoeSavedLayout L = moe_saved_layout(cfg, N);
  const int32_t* slot_row = moe_ints(saved + L.slot_row);
  ex.each(UnpermuteBody{dinp, dxrows, nullptr, slot_row, K, C, cfg.H_shared > 0}, static_cast<size_t>(N) * C);
  const float aux_scale = daux * static_cast<float>(E) / (static_cast<float>(N) * static_cast<float>(N));
  ex.each(RouterBackwardBody{dp, saved + L.probs, saved + L.weights, moe_ints(saved + L.experts),
                             moe_ints(saved + L.offsets), slot_row, dw, daux, aux_scale, E, K, cfg.renormalize},
          static_cast<size_t>(N));
  ex.gemm(true, false, E, C, N, 1.0f, dp, E, inp, C, 1.0f, gr.w_router, C);
  ex.gemm(false, false, N, C, E, 1.0f, dp, E, w.w_router, C, 1.0f, dinp, C);
}

template <class Exec>
void moe_layer_backward(Exec& ex, float* dinp, const MoeGrads& gr, const float* dout, float daux, const float* inp,
                        const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch) {
  const int E = cfg.E, K = cfg.K, C = cfg.C, H = cfg.H, NK = N * K;
  if (N == 0) return;
  const MoeSavedLayout L = moe_saved_layout(cfg, N);
  const MoeScratchLayout S = moe_scratch_layout(cfg, N, ex.plan_tmp_bytes(NK, E));
  const float* weights = saved + L.weights;
  const int32_t* offsets = moe_ints(saved + L.offsets);
  const int32_t* slot_row = moe_ints(saved + L.slot_row);
  float* xp = scratch + S.xp;
  float* dop = scratch + S.dop;
  float* h = scratch + S.h;
  float* dg = scratch + S.dg;
  float* dw = scratch + S.dw;
  float* wrow = scratch + S.wrow;
  moe_shared_expert_backward(ex, dinp, gr, dout, inp, saved, w, cfg, N, scratch + S.hs, scratch + S.dgs);
  ex.each(PermuteBody{xp, inp, slot_row, K, C}, static_cast<size_t>(NK) * C);
  ex.each(PermuteBody{dop, dout, slot_row, K, C}, static_cast<size_t>(NK) * C);
  ex.each(PermuteWeightsBody{wrow, weights, slot_row}, static_cast<size_t>(NK));
  std::vector<int32_t> off(static_cast<size_t>(E) + 1);
  ex.to_host(off.data(), offsets, sizeof(int32_t) * off.size());
  // Phase by phase as in forward, each phase one batch of per-segment GEMMs. Phases that read what
  // an earlier one wrote (or overwrite what it read: dx lands in xp, which dWg/dWu read) follow it.
  const float* g = saved + L.g;
  const float* u = saved + L.u;
  std::vector<RowMajorGemm> dh, dwd, dwgu, dx_g, dx_u;
  for (int e = 0; e < E; ++e) {
    const size_t R = static_cast<size_t>(off[static_cast<size_t>(e)]), we = static_cast<size_t>(e) * H * C;
    const int n = off[static_cast<size_t>(e) + 1] - off[static_cast<size_t>(e)];
    if (n == 0) continue;
    float* x = xp + R * C;
    float* hr = h + R * H;
    float* qr = dg + R * H;
    dh.push_back({false, false, n, H, C, 1.0f, dop + R * C, C, w.w_down + we, H, 0.0f, qr, H});
    dwd.push_back({true, false, C, H, n, 1.0f, dop + R * C, C, hr, H, 1.0f, gr.w_down + we, H});
    dwgu.push_back({true, false, H, C, n, 1.0f, qr, H, x, C, 1.0f, gr.w_gate + we, C});
    dwgu.push_back({true, false, H, C, n, 1.0f, hr, H, x, C, 1.0f, gr.w_up + we, C});
    dx_g.push_back({false, false, n, C, H, 1.0f, qr, H, w.w_gate + we, C, 0.0f, x, C});
    dx_u.push_back({false, false, n, C, H, 1.0f, hr, H, w.w_up + we, C, 1.0f, x, C});
  }
  ex.each(MoeSwigluBody{h, g, u}, static_cast<size_t>(NK) * H);   // h = silu(g) u
  ex.gemm_batch(dh);                                                // dh = dy Wd (in dg)
  ex.rows(WeightedRowBody{h, dg, dw, wrow, H}, NK);                 // d weight; h, dh *= weight
  ex.gemm_batch(dwd);                                               // dWd += dy^T (w h)
  ex.each(SwigluDhBody{h, dg, g, u}, static_cast<size_t>(NK) * H);  // du (in h), dg
  ex.gemm_batch(dwgu);                                              // dWg += dg^T x, dWu += du^T x
  ex.gemm_batch(dx_g);                                              // dx = dg Wg (in xp)
  ex.gemm_batch(dx_u);                                              // dx += du Wu
  moe_router_backward(ex, dinp, gr, xp, dw, scratch + S.dp, daux, inp, saved, w, cfg, N);
}

// The dispatcher alone (identity experts) for the round-trip tests: route plan from given experts,
// permute, combine; backward = permute of dout and the unweighted combine.
template <class Exec>
void moe_dispatch_round_trip(Exec& ex, float* out, float* back, int32_t* offsets, int32_t* row_slot,
                             int32_t* slot_row, const int32_t* experts, const float* weights, const float* inp, int N,
                             int K, int E, int C, float* xp, void* plan_tmp) {
  const int NK = N * K;
  ex.route_plan(offsets, row_slot, experts, NK, E, plan_tmp, ex.plan_tmp_bytes(NK, E));
  ex.each(InvertRowsBody{slot_row, row_slot}, static_cast<size_t>(NK));
  ex.each(PermuteBody{xp, inp, slot_row, K, C}, static_cast<size_t>(NK) * C);
  ex.each(UnpermuteBody{out, xp, weights, slot_row, K, C, false}, static_cast<size_t>(N) * C);
  ex.each(UnpermuteBody{back, xp, nullptr, slot_row, K, C, false}, static_cast<size_t>(N) * C);
}

}  // namespace troupe::kernels::cuda
