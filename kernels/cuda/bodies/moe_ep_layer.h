// The expert-parallel MoE layer (moe_expert_parallel.h; the CPU kernels::moe_ep_* are its
// specification) written once over an executor, as moe_layer.h: the CUDA backend runs it with
// DeviceExec (moe_ep.cu) and the host test with its HostExec. Router, top-k, shared expert, route
// plan, permute, combine and the router's backward are moe_layer.h's pieces on the rank's own N
// tokens; the routed experts become the group's exchange (MoeExpertGroup::exchange, moving the
// Exec's buffers) around the owned experts' GEMMs over (source rank, local expert) blocks, planned
// on the host by moe_ep_plan.h exactly as the CPU layer plans them.
//
// An Exec here is moe_layer.h's plus
//   grow(data, bytes, need)   (void*&, size_t&, size_t) at least `need` bytes; contents not kept
//   static release(data)      frees what grow gave
//   ep_scratch()              the owner's scratch of a pass (MoeEpScratch&), its release set
//   device_memory             static bool: whether its buffers are a device's
// The layer keeps its own buffers from forward to backward (MoeEpBuffers, in MoeEpState::device;
// moe_ep_buffers.h).
//
// Equality with the unsplit layer (moe_layer.h on each rank's own tokens): every GEMM of a block
// is the GEMM the source rank's unsplit path runs on that expert's segment (the same rows, in the
// same order, the same M), and the per-row bodies are the same, so outputs, d input and the router
// and shared expert gradients are the unsplit layer's bit for bit under the same GEMM. An owned
// expert's weight gradient adds its blocks in source order (one GEMM batch per source), as running
// the unsplit backward rank after rank into one gradient buffer would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe_ep_buffers.h"
#include "moe_layer.h"
#include "troupe/base/result.h"
#include "troupe/kernels/moe_ep_plan.h"
#include "troupe/kernels/moe_expert_parallel.h"

namespace troupe::kernels::cuda {

// ---- bodies ---------------------------------------------------------------------------------------

// Over N*K*(C+1): the rows a rank sends in backward, in the permuted (expert-major) order: row
// slot_row[s] = (x[s / K] (C floats), last[s]) -- the token's dout and the slot's combine weight.
struct PermutePackBody {
  float* packed;
  const float* x;
  const float* last;
  const int32_t* slot_row;
  int K, C;
  TROUPE_HD void operator()(size_t i) const {
    const size_t W = static_cast<size_t>(C) + 1, s = i / W, c = i % W;
    packed[static_cast<size_t>(slot_row[s]) * W + c] =
        c < static_cast<size_t>(C) ? x[(s / static_cast<size_t>(K)) * C + c] : last[s];
  }
};

// Over n*(C+1): packed row r = (rows[r] (C floats), last[r]).
struct PackRowsBody {
  float* packed;
  const float* rows;
  const float* last;
  int C;
  TROUPE_HD void operator()(size_t i) const {
    const size_t W = static_cast<size_t>(C) + 1, r = i / W, c = i % W;
    packed[i] = c < static_cast<size_t>(C) ? rows[r * C + c] : last[r];
  }
};

// Over n*(C+1): the inverse of PackRowsBody.
struct UnpackRowsBody {
  float* rows;
  float* last;
  const float* packed;
  int C;
  TROUPE_HD void operator()(size_t i) const {
    const size_t W = static_cast<size_t>(C) + 1, r = i / W, c = i % W;
    if (c < static_cast<size_t>(C))
      rows[r * C + c] = packed[i];
    else
      last[r] = packed[i];
  }
};

// ---- layouts and the layer's buffers --------------------------------------------------------------

// The expert-parallel layer's use of the unsplit layer's scratch (moe_scratch_layout: what
// Backend::moe_scratch_floats gives; this layout is never larger). Forward: the permuted inputs xp
// sent and the outputs yp received back (N K, C), hs, plan. Backward: the packed rows sent and
// received back (N K, C + 1), their dx (into xp) and d weights dw (N K), dp (N, E), hs, dgs.
struct MoeEpScratchLayout {
  size_t xp, yp, rows, dw, dp, hs, dgs, plan, total;
};
inline MoeEpScratchLayout moe_ep_scratch_layout(const MoeConfig& c, int N, size_t plan_bytes) {
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  MoeEpScratchLayout L{};
  size_t at = 0;
  auto put = [&at](size_t& f, size_t count) { f = at, at += (count + 1) / 2 * 2; };  // 8-byte aligned pieces
  put(L.xp, nk * c.C), put(L.yp, nk * c.C), put(L.rows, nk * (static_cast<size_t>(c.C) + 1)), put(L.dw, nk);
  put(L.dp, n * c.E), put(L.hs, n * c.H_shared), put(L.dgs, n * c.H_shared);
  put(L.plan, (plan_bytes + sizeof(float) - 1) / sizeof(float));
  L.total = at;
  return L;
}

// The layer's buffers (made by this Exec on first use); an error when the state holds another
// backend's.
template <class Exec>
Result<MoeEpBuffers*> moe_ep_buffers(MoeEpState& st) {
  if (!st.device) {
    auto made = std::make_unique<MoeEpBuffers>();
    made->release = &Exec::release;
    st.device = std::move(made);
  }
  auto* b = dynamic_cast<MoeEpBuffers*>(st.device.get());
  if (!b || b->release != &Exec::release)
    return make_error(ErrorCode::internal, "moe_ep: the layer's expert-parallel state belongs to another backend");
  return b;
}

// piece holds at least `floats` floats.
template <class Exec>
float* moe_ep_reserve(Exec& ex, MoeEpPiece& piece, size_t floats) {
  const size_t need = sizeof(float) * floats;
  if (need > piece.bytes) ex.grow(piece.data, piece.bytes, need + need / 4);
  return piece.f();
}

// ---- the owned experts between the two exchanges ----------------------------------------------------

// Forward from the rows' inputs xp (this rank's expert-major rows; off: the plan's offsets, E + 1,
// host): the counts, then each peer's run of rows to it, the owned experts over every (source,
// expert) block, the outputs back into y. xp and y may be null when no row is routed (N = 0).
template <class Exec>
Status moe_ep_experts_forward(Exec& ex, float* y, const float* xp, const std::vector<int32_t>& off,
                              const MoeWeights& w, const MoeConfig& c, const MoeExpertGroup& grp) {
  MoeExchange& xc = *grp.exchange;
  MoeEpState& st = *grp.state;
  const int P = xc.size(), Epr = c.E / P, C = c.C, H = c.H, me = xc.rank();
  TROUPE_TRY(moe_ep_exchange_counts(xc, off.data(), c.E, st.recv_rows));
  const MoeEpBlocks b = moe_ep_blocks(off.data(), st.recv_rows, P, Epr, C);
  Result<MoeEpBuffers*> got = moe_ep_buffers<Exec>(st);
  if (!got.ok()) return got.error();
  MoeEpBuffers& d = **got;
  const size_t M = static_cast<size_t>(b.M);
  MoeEpScratch& sc = ex.ep_scratch();
  float* x = moe_ep_reserve(ex, d.x, M * C);
  float* g = moe_ep_reserve(ex, d.g, M * H);
  float* u = moe_ep_reserve(ex, d.u, M * H);
  float* h = moe_ep_reserve(ex, sc.h, M * H);
  float* yr = moe_ep_reserve(ex, sc.rows, M * C);  // the owner's outputs, sent back
  d.forward_kept = true;
  TROUPE_TRY(xc.alltoallv(xp, b.send_n.data(), x, b.recv_n.data()));
  std::vector<RowMajorGemm> gate_up, down;
  for (int s = 0; s < P; ++s)
    for (int i = 0; i < Epr; ++i) {
      const int n = b.rows(s, i);
      if (n == 0) continue;
      const size_t R = static_cast<size_t>(b.block[static_cast<size_t>(s) * Epr + i]);
      const size_t we = static_cast<size_t>(me * Epr + i - grp.weights_first_expert) * H * C;
      gate_up.push_back({false, true, n, H, C, 1.0f, x + R * C, C, w.w_gate + we, C, 0.0f, g + R * H, H});
      gate_up.push_back({false, true, n, H, C, 1.0f, x + R * C, C, w.w_up + we, C, 0.0f, u + R * H, H});
      down.push_back({false, true, n, C, H, 1.0f, h + R * H, H, w.w_down + we, H, 0.0f, yr + R * C, C});
    }
  ex.gemm_batch(gate_up);
  ex.each(MoeSwigluBody{h, g, u}, M * H);
  ex.gemm_batch(down);
  return xc.alltoallv(yr, b.recv_n.data(), y, b.send_n.data());
}

// The owner's per-block GEMMs of one backward phase, grouped for gemm_batch: phases whose GEMMs
// write separate outputs (dh, dx) take every block in one batch; the weight gradients, which
// blocks of one expert add into, one batch per source rank, in rank order.
struct MoeEpBackwardPhases {
  std::vector<RowMajorGemm> dh, dx_g, dx_u;
  std::vector<std::vector<RowMajorGemm>> dwd, dwgu;  // [source]
};
inline MoeEpBackwardPhases moe_ep_backward_phases(const MoeEpBlocks& b, int me, const MoeGrads& gr,
                                                  const MoeWeights& w, const MoeConfig& c, int first_expert,
                                                  const MoeEpBuffers& d, const MoeEpScratch& sc) {
  const int C = c.C, H = c.H;
  MoeEpBackwardPhases ph;
  ph.dwd.resize(static_cast<size_t>(b.P)), ph.dwgu.resize(static_cast<size_t>(b.P));
  for (int s = 0; s < b.P; ++s)
    for (int i = 0; i < b.Epr; ++i) {
      const int n = b.rows(s, i);
      if (n == 0) continue;
      const size_t R = static_cast<size_t>(b.block[static_cast<size_t>(s) * b.Epr + i]);
      const size_t we = static_cast<size_t>(me * b.Epr + i - first_expert) * H * C;
      float* x = d.x.f() + R * C;
      float* dop = sc.dop.f() + R * C;  // dout, then dx
      float* hr = sc.h.f() + R * H;
      float* qr = sc.dg.f() + R * H;
      ph.dh.push_back({false, false, n, H, C, 1.0f, dop, C, w.w_down + we, H, 0.0f, qr, H});
      ph.dwd[static_cast<size_t>(s)].push_back({true, false, C, H, n, 1.0f, dop, C, hr, H, 1.0f, gr.w_down + we, H});
      ph.dwgu[static_cast<size_t>(s)].push_back({true, false, H, C, n, 1.0f, qr, H, x, C, 1.0f, gr.w_gate + we, C});
      ph.dwgu[static_cast<size_t>(s)].push_back({true, false, H, C, n, 1.0f, hr, H, x, C, 1.0f, gr.w_up + we, C});
      ph.dx_g.push_back({false, false, n, C, H, 1.0f, qr, H, w.w_gate + we, C, 0.0f, dop, C});
      ph.dx_u.push_back({false, false, n, C, H, 1.0f, hr, H, w.w_up + we, C, 1.0f, dop, C});
    }
  return ph;
}

// Backward: rows (this rank's N K expert-major rows of C + 1: dout and combine weight; may be null
// when none) to the owners, the routed experts' backward on the blocks the forward kept, and each
// row's dx and d weight back into rows.
template <class Exec>
Status moe_ep_experts_backward(Exec& ex, float* rows, const std::vector<int32_t>& off, const MoeGrads& gr,
                               const MoeWeights& w, const MoeConfig& c, const MoeExpertGroup& grp) {
  MoeExchange& xc = *grp.exchange;
  MoeEpState& st = *grp.state;
  const int P = xc.size(), Epr = c.E / P, C = c.C, H = c.H, W = C + 1;
  Result<MoeEpBuffers*> got = moe_ep_buffers<Exec>(st);
  if (!got.ok()) return got.error();
  MoeEpBuffers& d = **got;
  if (!d.forward_kept || st.recv_rows.size() != static_cast<size_t>(c.E))
    return make_error(ErrorCode::internal, "moe_ep backward on rank " + std::to_string(xc.rank()) +
                                               ": no forward of this layer kept its rows");
  const MoeEpBlocks b = moe_ep_blocks(off.data(), st.recv_rows, P, Epr, W);
  const size_t M = static_cast<size_t>(b.M);
  MoeEpScratch& sc = ex.ep_scratch();
  float* recv = moe_ep_reserve(ex, sc.rows, M * W);
  float* dop = moe_ep_reserve(ex, sc.dop, M * C);
  float* wrow = moe_ep_reserve(ex, sc.wrow, M);
  float* dw = moe_ep_reserve(ex, sc.dw, M);
  float* h = moe_ep_reserve(ex, sc.h, M * H);
  float* dg = moe_ep_reserve(ex, sc.dg, M * H);
  const float* g = d.g.f();
  const float* u = d.u.f();
  d.forward_kept = false;
  TROUPE_TRY(xc.alltoallv(rows, b.send_n.data(), recv, b.recv_n.data()));
  ex.each(UnpackRowsBody{dop, wrow, recv, C}, M * W);
  const MoeEpBackwardPhases ph = moe_ep_backward_phases(b, xc.rank(), gr, w, c, grp.weights_first_expert, d, sc);
  ex.each(MoeSwigluBody{h, g, u}, M * H);                         // h = silu(g) u
  ex.gemm_batch(ph.dh);                                           // dh = dy Wd (in dg)
  ex.rows(WeightedRowBody{h, dg, dw, wrow, H}, static_cast<int>(M));  // d weight; h, dh *= weight
  for (const auto& batch : ph.dwd) ex.gemm_batch(batch);          // dWd += dy^T (w h), source by source
  ex.each(SwigluDhBody{h, dg, g, u}, M * H);                      // du (in h), dg
  for (const auto& batch : ph.dwgu) ex.gemm_batch(batch);         // dWg += dg^T x, dWu += du^T x
  ex.gemm_batch(ph.dx_g);                                         // dx = dg Wg (in dop)
  ex.gemm_batch(ph.dx_u);                                         // dx += du Wu
  ex.each(PackRowsBody{recv, dop, dw, C}, M * W);
  return xc.alltoallv(recv, b.recv_n.data(), rows, b.send_n.data());
}

// ---- the layer ----------------------------------------------------------------------------------

// What the layer refuses besides moe_ep_check_group's: an exchange whose buffers are not the
// Exec's memory (on cuda a host exchange, the learners' MPI one: the device layer needs the NCCL
// exchange Backend::join_expert_exchange makes), and adapters on the routed experts (moe_layer.h
// has none).
template <class Exec>
Status moe_ep_layer_check(const MoeConfig& cfg, const MoeWeights& w, const MoeExpertGroup& grp) {
  TROUPE_TRY(moe_ep_check_group(cfg, grp));
  if (grp.exchange->device_buffers() != Exec::device_memory)
    return invalid_input(Exec::device_memory
                             ? "moe_ep on cuda: the group's exchange moves host memory (the learners' MPI "
                               "all-to-all); the device layer needs the exchange Backend::join_expert_exchange "
                               "makes (NCCL between the group's GPUs)"
                             : "moe_ep: the group's exchange moves device memory; this layer's buffers are the "
                               "host's");
  if (w.lora.r > 0)
    return invalid_input("moe_ep on cuda: adapters on the routed experts (policy.lora.targets: experts) are not "
                         "implemented on CUDA");
  return {};
}

// Backend::moe_ep_forward: moe_layer_forward with the routed experts split over the group. N may be
// 0 (the rank still serves its experts; out and scratch unused, saved may be null). route (routing
// replay) must be null: the device layer has none.
template <class Exec>
Status moe_layer_ep_forward(Exec& ex, float* out, float* saved, MoeStats* stats, const float* inp,
                            const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch, const int32_t* route,
                            const MoeExpertGroup& grp) {
  if (route)
    return invalid_input("moe_ep_forward on cuda: routing replay (recorded experts) is not implemented on CUDA");
  TROUPE_TRY(moe_ep_layer_check<Exec>(cfg, w, grp));
  const int E = cfg.E;
  std::vector<int32_t> off(static_cast<size_t>(E) + 1, 0);
  if (N == 0) {
    if (saved) ex.zero(saved + moe_saved_layout(cfg, 0).offsets, sizeof(int32_t) * off.size());
    if (stats) *stats = MoeStats{};
    return moe_ep_experts_forward(ex, nullptr, nullptr, off, w, cfg, grp);
  }
  const size_t plan_bytes = ex.plan_tmp_bytes(N * cfg.K, E);
  const MoeEpScratchLayout S = moe_ep_scratch_layout(cfg, N, plan_bytes);
  if (S.total > moe_scratch_layout(cfg, N, plan_bytes).total)
    return make_error(ErrorCode::internal, "moe_ep: its scratch layout outgrew the layer's scratch");
  float* xp = scratch + S.xp;
  float* y = scratch + S.yp;
  off = moe_route_and_permute(ex, out, saved, inp, w, cfg, N, xp, scratch + S.hs, scratch + S.plan, plan_bytes);
  TROUPE_TRY(moe_ep_experts_forward(ex, y, xp, off, w, cfg, grp));
  moe_combine_and_stats(ex, out, stats, y, saved, off, cfg, N);
  return {};
}

// Backend::moe_ep_backward: moe_layer_backward with the routed experts split over the group.
template <class Exec>
Status moe_layer_ep_backward(Exec& ex, float* dinp, const MoeGrads& gr, const float* dout, float daux,
                             const float* inp, const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N,
                             float* scratch, const MoeExpertGroup& grp) {
  TROUPE_TRY(moe_ep_layer_check<Exec>(cfg, w, grp));
  const int E = cfg.E, K = cfg.K, C = cfg.C, NK = N * K;
  std::vector<int32_t> off(static_cast<size_t>(E) + 1, 0);
  if (N == 0) return moe_ep_experts_backward(ex, nullptr, off, gr, w, cfg, grp);
  const MoeSavedLayout L = moe_saved_layout(cfg, N);
  const MoeEpScratchLayout S = moe_ep_scratch_layout(cfg, N, ex.plan_tmp_bytes(NK, E));
  float* rows = scratch + S.rows;
  float* dx = scratch + S.xp;
  float* dw = scratch + S.dw;
  moe_shared_expert_backward(ex, dinp, gr, dout, inp, saved, w, cfg, N, scratch + S.hs, scratch + S.dgs);
  ex.to_host(off.data(), saved + L.offsets, sizeof(int32_t) * off.size());
  ex.each(PermutePackBody{rows, dout, saved + L.weights, moe_ints(saved + L.slot_row), K, C},
          static_cast<size_t>(NK) * (static_cast<size_t>(C) + 1));
  TROUPE_TRY(moe_ep_experts_backward(ex, rows, off, gr, w, cfg, grp));
  ex.each(UnpackRowsBody{dx, dw, rows, C}, static_cast<size_t>(NK) * (static_cast<size_t>(C) + 1));
  moe_router_backward(ex, dinp, gr, dx, dw, scratch + S.dp, daux, inp, saved, w, cfg, N);
  return {};
}

// Backend::moe_ep_serve_forward / serve_backward: a rank with no tokens of its own serves its
// experts to its peers (the layer with N = 0).
template <class Exec>
Status moe_layer_ep_serve_forward(Exec& ex, const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& grp) {
  return moe_layer_ep_forward(ex, nullptr, nullptr, nullptr, nullptr, w, cfg, 0, nullptr, nullptr, grp);
}
template <class Exec>
Status moe_layer_ep_serve_backward(Exec& ex, const MoeGrads& gr, const MoeWeights& w, const MoeConfig& cfg,
                                   const MoeExpertGroup& grp) {
  return moe_layer_ep_backward(ex, nullptr, gr, nullptr, 0.0f, nullptr, nullptr, w, cfg, 0, nullptr, grp);
}

}  // namespace troupe::kernels::cuda
