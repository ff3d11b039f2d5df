// MoE layer forward/backward (moe.h): router -> top-k -> dispatch -> per-expert SwiGLU -> combine.
// Invariant: the grouped path and the masked loop differ ONLY in how the (token, expert) rows are
// found (counting sort vs a scan per expert); rows, GEMM calls and every floating-point reduction
// are the same and in the same order, so both give bit-identical outputs and gradients.
#include "troupe/kernels/moe.h"
#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/kernels/moe_ep_plan.h"

#include <cblas.h>
#include <omp.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <new>
#include <utility>
#include <vector>

#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels {
namespace {

// int32 arrays live in the caller's float buffers (same size); placement-new starts their lifetime.
int32_t* ints_at(float* p, size_t n) { return new (p) int32_t[n]; }
const int32_t* ints_at(const float* p) { return std::launder(reinterpret_cast<const int32_t*>(p)); }

// Offsets (in floats) of pieces laid out one after another in one flat buffer: each field of L
// named in `pieces` gets the running offset, then the running offset grows by the piece's count;
// L::total is the whole size.
template <class L>
L bump_layout(std::initializer_list<std::pair<size_t L::*, size_t>> pieces) {
  L l{};
  size_t at = 0;
  for (const auto& [field, count] : pieces) {
    l.*field = at;
    at += count;
  }
  l.total = at;
  return l;
}

// Offsets (in floats) of the pieces of the saved buffer. Per token: E probs, K weights, K experts,
// 2K row maps, and per row the expert's gate/up pre-activations (2H) — y is not kept: backward
// gets d weight from <h, dout Wd> instead of <y, dout>.
struct SavedLayout {
  size_t probs, weights, experts, offsets, row_slot, slot_row, g, u, gs, us, total;
};
SavedLayout saved_layout(const MoeConfig& c, int N) {
  using L = SavedLayout;
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  return bump_layout<L>({{&L::probs, n * c.E}, {&L::weights, nk}, {&L::experts, nk},
                         {&L::offsets, static_cast<size_t>(c.E) + 1}, {&L::row_slot, nk}, {&L::slot_row, nk},
                         {&L::g, nk * c.H}, {&L::u, nk * c.H}, {&L::gs, n * c.H_shared}, {&L::us, n * c.H_shared}});
}

// Forward scratch: permuted inputs xp and outputs yp (N*K, C), hidden h (N*K, H), plan counts (E).
struct ForwardScratch {
  size_t xp, yp, h, hs, counts, total;
};
ForwardScratch forward_scratch(const MoeConfig& c, int N) {
  using L = ForwardScratch;
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  return bump_layout<L>({{&L::xp, nk * c.C}, {&L::yp, nk * c.C}, {&L::h, nk * c.H}, {&L::hs, n * c.H_shared},
                         {&L::counts, static_cast<size_t>(c.E)}});
}

// Backward scratch, aliased by lifetime: xp is overwritten by dx, h by du; dop holds the permuted
// (unscaled) dout rows, dg the gate gradient.
struct BackwardScratch {
  size_t xp, dop, h, dg, dw, wrow, dp, hs, dgs, rows, total;
};
BackwardScratch backward_scratch(const MoeConfig& c, int N) {
  using L = BackwardScratch;
  const size_t n = static_cast<size_t>(N), nk = n * static_cast<size_t>(c.K);
  return bump_layout<L>({{&L::xp, nk * c.C}, {&L::dop, nk * c.C}, {&L::h, nk * c.H}, {&L::dg, nk * c.H},
                         {&L::dw, nk}, {&L::wrow, nk}, {&L::dp, n * c.E}, {&L::hs, n * c.H_shared},
                         {&L::dgs, n * c.H_shared}, {&L::rows, nk}});
}

// Every GEMM goes through gemm_blocked (ops.h): the same blocks of kGemmRowBlock output rows
// whether it runs inside a parallel region (grouped: one expert per thread) or outside one (masked:
// the blocks spread over the threads). OpenBLAS may pick a different micro-kernel for a different
// M (on Zen its tail kernels round differently), so equal blocks are what keep both dispatch
// paths, and any thread count, bit-identical.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* Cm, int ldc) {
  gemm_blocked(ta == CblasTrans, tb == CblasTrans, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}

// Dot product in a fixed order, the same in both paths: 8 interleaved partial sums (the compiler
// vectorizes them), added left to right, then the tail. Depends only on C, never on the path or
// the thread count.
inline float dot_row(const float* a, const float* b, int C) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= C; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (int j = 0; j < 8; ++j) s += acc[j];
  for (; i < C; ++i) s += a[i] * b[i];
  return s;
}

// Rows are gathered and scattered at data-dependent places: ask for the next one's cache lines
// while this one is copied (both paths do this wherever they walk rows).
constexpr int kAhead = 4;  // rows (or tokens) ahead
inline void prefetch_row(const float* p, int C) {
  for (int i = 0; i < C; i += 16) __builtin_prefetch(p + i);
}

// Rows written whole and read only by a later pass (the permuted buffers, the combine's output)
// go around the cache with streaming stores once a pass writes more than moe_stream_bytes(): no
// read-for-ownership of lines about to be overwritten, and they do not evict what the next rows
// need. A buffer well inside the last-level cache stays there for the pass that reads it (on a
// large L3 streaming them to memory costs more than it saves), so the default threshold is a
// quarter of that cache, at least 4 MiB. The values written are the same either way. A thread that
// streamed calls store_fence() before the pass ends (streaming stores are weakly ordered).
size_t default_stream_bytes() {
  constexpr size_t kFloor = size_t(4) << 20;
  long llc = -1;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return llc > 0 ? std::max(kFloor, static_cast<size_t>(llc) / 4) : kFloor;
}
std::atomic<size_t>& stream_bytes_setting() {
  static std::atomic<size_t> bytes{default_stream_bytes()};
  return bytes;
}
inline bool stream_rows(const float* base, size_t rows, int C) {
#if defined(__SSE2__)
  return rows * static_cast<size_t>(C) * sizeof(float) >= stream_bytes_setting().load(std::memory_order_relaxed) &&
         C % 4 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
#else
  (void)base, (void)rows, (void)C;
  return false;
#endif
}
inline void store_fence(bool streamed) {
#if defined(__SSE2__)
  if (streamed) _mm_sfence();
#else
  (void)streamed;
#endif
}
// dst = src (w == nullptr) or w * src, C floats.
inline void write_row(float* dst, const float* src, const float* w, int C, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    if (w) {
      const __m128 wv = _mm_set1_ps(*w);
      for (int i = 0; i < C; i += 4) _mm_stream_ps(dst + i, _mm_mul_ps(wv, _mm_loadu_ps(src + i)));
    } else {
      for (int i = 0; i < C; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    }
    return;
  }
#else
  (void)stream;
#endif
  if (w) {
    const float wk = *w;
    for (int i = 0; i < C; ++i) dst[i] = wk * src[i];
  } else {
    std::memcpy(dst, src, sizeof(float) * C);
  }
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// h (nh) = silu(g) * u.
inline void swiglu_rows(float* h, const float* g, const float* u, size_t nh) {
  for (size_t i = 0; i < nh; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

// ---- LoRA on one routed expert (MoeLoraWeights) ---------------------------------------------------
// Expert e's adapters and their gradients (null: the expert has none).
struct ExpertLora {
  const float *ag, *bg, *au, *bu, *ad, *bd;
  float *dag, *dbg, *dau, *dbu, *dad, *dbd;  // null in forward
  int r;
  float s;
};
ExpertLora expert_lora(const MoeLoraWeights& l, const MoeLoraGrads* g, int e) {
  const size_t o = static_cast<size_t>(e) * l.stride;
  ExpertLora x{l.a_gate + o, l.b_gate + o, l.a_up + o, l.b_up + o, l.a_down + o, l.b_down + o,
               nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, l.r, l.scale};
  if (g) {
    x.dag = g->a_gate + o, x.dbg = g->b_gate + o, x.dau = g->a_up + o, x.dbu = g->b_up + o;
    x.dad = g->a_down + o, x.dbd = g->b_down + o;
  }
  return x;
}
// Scratch of (n, r) blocks for one expert's adapters on this thread (kept between calls).
float* lora_scratch(size_t floats) {
  thread_local std::vector<float> s;
  if (s.size() < floats) s.resize(floats);
  return s.data();
}
// y (n, OUT) += s (x A^T) B^T, A (r, IN), B (OUT, r); t (n, r) scratch.
void lora_add(float* y, const float* x, const float* A, const float* B, float* t, int n, int IN, int OUT, int r,
              float s) {
  sgemm(CblasNoTrans, CblasTrans, n, r, IN, 1.0f, x, IN, A, IN, 0.0f, t, r);
  sgemm(CblasNoTrans, CblasTrans, n, OUT, r, s, t, r, B, r, 1.0f, y, OUT);
}

// ---- one expert's SwiGLU FFN on a block of rows (routed segments and the shared expert) ---------
// g = X Wg^T, u = X Wu^T (n, H); h = silu(g) * u; y = h Wd^T (n, C). g, u kept for backward. With
// adapters (la) each projection adds its low-rank path.
void expert_ffn_forward(float* y, float* g, float* u, float* h, const float* x, const float* wg,
                        const float* wu, const float* wd, int n, int C, int H, const ExpertLora* la = nullptr) {
  if (n == 0) return;
  float* t = la ? lora_scratch(static_cast<size_t>(n) * la->r) : nullptr;
  sgemm(CblasNoTrans, CblasTrans, n, H, C, 1.0f, x, C, wg, C, 0.0f, g, H);
  if (la) lora_add(g, x, la->ag, la->bg, t, n, C, H, la->r, la->s);
  sgemm(CblasNoTrans, CblasTrans, n, H, C, 1.0f, x, C, wu, C, 0.0f, u, H);
  if (la) lora_add(u, x, la->au, la->bu, t, n, C, H, la->r, la->s);
  swiglu_rows(h, g, u, static_cast<size_t>(n) * H);
  sgemm(CblasNoTrans, CblasTrans, n, C, H, 1.0f, h, H, wd, H, 0.0f, y, C);
  if (la) lora_add(y, h, la->ad, la->bd, t, n, H, C, la->r, la->s);
}

// The gate and up adapters' gradients from dg, du (n, H) and the input x (read before dx is
// written): dA += s (d B)^T x, dB += s d^T (x A^T); tg, tu (n, r) keep d B for dx.
void lora_gate_up_backward(const ExpertLora& la, const float* dg, const float* du, const float* x, float* tg,
                           float* tu, float* v, int n, int C, int H) {
  const int r = la.r;
  const float s = la.s;
  sgemm(CblasNoTrans, CblasNoTrans, n, r, H, 1.0f, dg, H, la.bg, r, 0.0f, tg, r);
  sgemm(CblasNoTrans, CblasNoTrans, n, r, H, 1.0f, du, H, la.bu, r, 0.0f, tu, r);
  sgemm(CblasTrans, CblasNoTrans, r, C, n, s, tg, r, x, C, 1.0f, la.dag, C);
  sgemm(CblasTrans, CblasNoTrans, r, C, n, s, tu, r, x, C, 1.0f, la.dau, C);
  sgemm(CblasNoTrans, CblasTrans, n, r, C, 1.0f, x, C, la.ag, C, 0.0f, v, r);
  sgemm(CblasTrans, CblasNoTrans, H, r, n, s, dg, H, v, r, 1.0f, la.dbg, r);
  sgemm(CblasNoTrans, CblasTrans, n, r, C, 1.0f, x, C, la.au, C, 0.0f, v, r);
  sgemm(CblasTrans, CblasNoTrans, H, r, n, s, du, H, v, r, 1.0f, la.dbu, r);
}

// The end of an expert's backward, from dh (in dg) and the saved g, u: du (over h) and dg
// (SwiGLU backward), dWg += dg^T x, dWu += du^T x, then dx (n, C) = dg Wg + du Wu, assigned. dx
// may be x: the weight gradients read x before dx is written.
void expert_ffn_backward_from_dh(float* dx, float* dwg, float* dwu, float* h, float* dg, const float* g,
                                 const float* u, const float* x, const float* wg, const float* wu, int n, int C,
                                 int H, const ExpertLora* la = nullptr) {
  const size_t nh = static_cast<size_t>(n) * H;
  float* du = h;
  for (size_t i = 0; i < nh; ++i) {
    const float s = sigmoid(g[i]), dh = dg[i];
    du[i] = dh * g[i] * s;
    dg[i] = dh * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
  sgemm(CblasTrans, CblasNoTrans, H, C, n, 1.0f, dg, H, x, C, 1.0f, dwg, C);
  sgemm(CblasTrans, CblasNoTrans, H, C, n, 1.0f, du, H, x, C, 1.0f, dwu, C);
  float* t = la ? lora_scratch(3 * static_cast<size_t>(n) * la->r) : nullptr;
  float* tg = t;
  float* tu = la ? t + static_cast<size_t>(n) * la->r : nullptr;
  if (la) lora_gate_up_backward(*la, dg, du, x, tg, tu, tu + static_cast<size_t>(n) * la->r, n, C, H);
  sgemm(CblasNoTrans, CblasNoTrans, n, C, H, 1.0f, dg, H, wg, C, 0.0f, dx, C);
  sgemm(CblasNoTrans, CblasNoTrans, n, C, H, 1.0f, du, H, wu, C, 1.0f, dx, C);
  if (la) {  // dx += s (dg Bg) Ag + s (du Bu) Au
    sgemm(CblasNoTrans, CblasNoTrans, n, C, la->r, la->s, tg, la->r, la->ag, C, 1.0f, dx, C);
    sgemm(CblasNoTrans, CblasNoTrans, n, C, la->r, la->s, tu, la->r, la->au, C, 1.0f, dx, C);
  }
}

// Backward of expert_ffn_forward for the shared expert (weight 1). dWg/dWu/dWd accumulated; dx (n, C)
// assigned. h (n, H) is scratch that ends holding du; dg (n, H) scratch.
void shared_expert_backward(float* dx, float* dwg, float* dwu, float* dwd, const float* dy, const float* x,
                            const float* g, const float* u, const float* wg, const float* wu, const float* wd,
                            float* h, float* dg, int n, int C, int H) {
  if (n == 0) return;
  swiglu_rows(h, g, u, static_cast<size_t>(n) * H);
  sgemm(CblasTrans, CblasNoTrans, C, H, n, 1.0f, dy, C, h, H, 1.0f, dwd, H);
  sgemm(CblasNoTrans, CblasNoTrans, n, H, C, 1.0f, dy, C, wd, H, 0.0f, dg, H);  // dh
  expert_ffn_backward_from_dh(dx, dwg, dwu, h, dg, g, u, x, wg, wu, n, C, H);  // h is dead after dWd
}

// Backward of one routed expert over its segment of n permuted rows. The row's output was
// w_r * y_r with y_r = h_r Wd^T, so with q_r = dout_r Wd (unscaled): d w_r = <h_r, q_r>,
// dh_r = w_r q_r, dWd += sum_r dout_r^T (w_r h_r). xp (n, C) in: the rows' inputs, out: their dx.
// dop (n, C): the rows' dout (unscaled); w_row (n): the rows' weights; dw_row (n) out.
// With adapters (la): q = dop (Wd + s Bd Ad), and dBd += s dop^T ((w h) Ad^T), dAd += s (dop Bd)^T (w h).
void routed_expert_backward(float* xp, float* dw_row, float* dwg, float* dwu, float* dwd, const float* dop,
                            const float* w_row, const float* g, const float* u, const float* wg,
                            const float* wu, const float* wd, float* h, float* dg, int n, int C, int H,
                            const ExpertLora* la = nullptr) {
  if (n == 0) return;
  swiglu_rows(h, g, u, static_cast<size_t>(n) * H);
  sgemm(CblasNoTrans, CblasNoTrans, n, H, C, 1.0f, dop, C, wd, H, 0.0f, dg, H);  // q
  float* t = la ? lora_scratch(2 * static_cast<size_t>(n) * la->r) : nullptr;  // (dop Bd), (w h) Ad^T
  if (la) {
    sgemm(CblasNoTrans, CblasNoTrans, n, la->r, C, 1.0f, dop, C, la->bd, la->r, 0.0f, t, la->r);
    sgemm(CblasNoTrans, CblasNoTrans, n, H, la->r, la->s, t, la->r, la->ad, H, 1.0f, dg, H);
  }
  for (int r = 0; r < n; ++r) {
    float* hr = h + static_cast<size_t>(r) * H;
    float* qr = dg + static_cast<size_t>(r) * H;
    const float wr = w_row[r];
    dw_row[r] = dot_row(hr, qr, H);
    for (int i = 0; i < H; ++i) {
      hr[i] *= wr;  // w h, for dWd
      qr[i] *= wr;  // dh
    }
  }
  sgemm(CblasTrans, CblasNoTrans, C, H, n, 1.0f, dop, C, h, H, 1.0f, dwd, H);
  if (la) {
    float* v = t + static_cast<size_t>(n) * la->r;
    sgemm(CblasNoTrans, CblasTrans, n, la->r, H, 1.0f, h, H, la->ad, H, 0.0f, v, la->r);
    sgemm(CblasTrans, CblasNoTrans, C, la->r, n, la->s, dop, C, v, la->r, 1.0f, la->dbd, la->r);
    sgemm(CblasTrans, CblasNoTrans, la->r, H, n, la->s, t, la->r, h, H, 1.0f, la->dad, H);
  }
  // w h is dead after dWd; the inputs xp are dead after dWg, dWu and become dx.
  expert_ffn_backward_from_dh(xp, dwg, dwu, h, dg, g, u, xp, wg, wu, n, C, H, la);
}

// ---- router ----------------------------------------------------------------------------------
// probs (N, E) = softmax(X Wr^T); experts/weights (N, K): the top-k (ties -> lower index), stored
// per token in ascending expert id so that "k order" equals "expert order" in every reduction.
// route (N, K) or null: a token whose row starts with an id >= 0 takes those experts (routing
// replay) instead of its top-k; its weights come from its own probabilities over that set.
void router_forward(float* probs, int32_t* experts, float* weights, const float* x, const float* wr,
                    const MoeConfig& c, int N, const int32_t* route) {
  const int E = c.E, K = c.K, C = c.C;
  sgemm(CblasNoTrans, CblasTrans, N, E, C, 1.0f, x, C, wr, C, 0.0f, probs, E);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * E * 8))
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
    const int32_t* forced = route ? route + static_cast<size_t>(t) * K : nullptr;
    if (forced && forced[0] >= 0) {
      std::copy(forced, forced + K, ex);
      std::sort(ex, ex + K);
      float s = 0;
      for (int k = 0; k < K; ++k) s += p[ex[k]];
      for (int k = 0; k < K; ++k) w[k] = c.renormalize ? p[ex[k]] / s : p[ex[k]];
      continue;
    }
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
  const bool invariant = batch_invariant();  // the experts' GEMMs run on other threads: carry the mode
#pragma omp parallel for schedule(dynamic, 1) if (parallel_worth(double(offsets[c.E]) * C * H))
  for (int e = 0; e < c.E; ++e) {
    const BatchInvariantScope mode(invariant);
    const size_t r0 = static_cast<size_t>(offsets[e]);
    const int n = offsets[e + 1] - offsets[e];
    const size_t we = static_cast<size_t>(e) * H * C;
    const ExpertLora la = expert_lora(w.lora, nullptr, e);
    expert_ffn_forward(y + r0 * C, g + r0 * H, u + r0 * H, h + r0 * H, xp + r0 * C, w.w_gate + we, w.w_up + we,
                   w.w_down + we, n, C, H, w.lora.r > 0 ? &la : nullptr);
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

void moe_permute(float* xp, const float* x, const int32_t* slot_row, int N, int K, int C) {
  // A walk over the tokens: each x row is read once, in order, and copied to its K rows.
  const bool stream = stream_rows(xp, static_cast<size_t>(N) * K, C);
#pragma omp parallel if (parallel_worth(double(N) * K * C))
  {
#pragma omp for schedule(static) nowait
    for (int t = 0; t < N; ++t) {
      const float* src = x + static_cast<size_t>(t) * C;
      for (int k = 0; k < K; ++k)
        write_row(xp + static_cast<size_t>(slot_row[t * K + k]) * C, src, nullptr, C, stream);
    }
    store_fence(stream);
  }
}

namespace {
// One output row of the combine: o = (o or 0) + w_0 y_0 + w_1 y_1 + ... (k ascending), 8 channels
// at a time in registers, multiply then add (never fused), so the bits equal zeroing o and
// accumulating the rows one by one. Instantiated per (weighted, accumulate): the branches stay
// out of the inner loop, which keeps the row loads back to back.
template <bool kWeighted, bool kAccumulate>
inline void combine_row(float* o, const float* yp, const int32_t* rows, const float* wt, int K, int C,
                        bool stream) {
  int i = 0;
#if defined(__SSE2__)
  for (; i + 8 <= C; i += 8) {
    __m128 a0 = kAccumulate ? _mm_loadu_ps(o + i) : _mm_setzero_ps();
    __m128 a1 = kAccumulate ? _mm_loadu_ps(o + i + 4) : _mm_setzero_ps();
    for (int k = 0; k < K; ++k) {
      const float* yr = yp + static_cast<size_t>(rows[k]) * C + i;
      __m128 y0 = _mm_loadu_ps(yr), y1 = _mm_loadu_ps(yr + 4);
      if (kWeighted) {
        const __m128 w = _mm_set1_ps(wt[k]);
        y0 = _mm_mul_ps(w, y0);
        y1 = _mm_mul_ps(w, y1);
      }
      a0 = _mm_add_ps(a0, y0);
      a1 = _mm_add_ps(a1, y1);
    }
    if (stream) {
      _mm_stream_ps(o + i, a0);
      _mm_stream_ps(o + i + 4, a1);
    } else {
      _mm_storeu_ps(o + i, a0);
      _mm_storeu_ps(o + i + 4, a1);
    }
  }
#else
  (void)stream;
#endif
  for (; i < C; ++i) {
    float acc = kAccumulate ? o[i] : 0.0f;
    for (int k = 0; k < K; ++k) {
      const float y = yp[static_cast<size_t>(rows[k]) * C + i];
      acc += kWeighted ? wt[k] * y : y;
    }
    o[i] = acc;
  }
}

template <bool kWeighted, bool kAccumulate>
void unpermute_rows(float* out, const float* yp, const float* weights, const int32_t* slot_row, int N, int K,
                    int C) {
  const bool stream = !kAccumulate && stream_rows(out, static_cast<size_t>(N), C);  // assigned rows only
#pragma omp parallel if (parallel_worth(double(N) * K * C))
  {
#pragma omp for schedule(static) nowait
    for (int t = 0; t < N; ++t) {
      if (t + kAhead < N)
        for (int k = 0; k < K; ++k)
          prefetch_row(yp + static_cast<size_t>(slot_row[(t + kAhead) * K + k]) * C, C);
      combine_row<kWeighted, kAccumulate>(out + static_cast<size_t>(t) * C, yp,
                                          slot_row + static_cast<size_t>(t) * K,
                                          kWeighted ? weights + static_cast<size_t>(t) * K : nullptr, K, C, stream);
    }
    store_fence(stream);
  }
}
}  // namespace

void moe_unpermute(float* out, const float* yp, const float* weights, const int32_t* slot_row, int N, int K,
                   int C, bool accumulate) {
  // One pass over each output row, the same additions in the same order as zeroing out and
  // accumulating expert by expert (the masked loop).
  if (weights) {
    accumulate ? unpermute_rows<true, true>(out, yp, weights, slot_row, N, K, C)
               : unpermute_rows<true, false>(out, yp, weights, slot_row, N, K, C);
  } else {
    accumulate ? unpermute_rows<false, true>(out, yp, weights, slot_row, N, K, C)
               : unpermute_rows<false, false>(out, yp, weights, slot_row, N, K, C);
  }
}

size_t moe_stream_bytes() { return stream_bytes_setting().load(std::memory_order_relaxed); }
void set_moe_stream_bytes(size_t bytes) { stream_bytes_setting().store(bytes, std::memory_order_relaxed); }

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

// ---- expert parallelism (moe_expert_parallel.h) ------------------------------------------------
// Runs fn(e, r0, n) for every block of received rows: rows [r0, r0 + n) from one source rank for
// this rank's expert e (global id). The experts in parallel, each one's sources in rank order (the
// order its weight gradient adds them in).
template <class Fn>
void for_each_ep_block(const MoeEpBlocks& b, const std::vector<int32_t>& recv_rows, int me, double work, Fn fn) {
  const bool invariant = batch_invariant();
#pragma omp parallel for schedule(dynamic, 1) if (parallel_worth(work))
  for (int i = 0; i < b.Epr; ++i) {
    const BatchInvariantScope mode(invariant);
    for (int s = 0; s < b.P; ++s) {
      const size_t k = static_cast<size_t>(s) * b.Epr + i;
      fn(me * b.Epr + i, b.block[k], recv_rows[k]);
    }
  }
}

// Forward: counts, then the rows' inputs xp (expert-major, so each peer's rows are one run) to the
// owners, the owned experts over each (expert, source) block, the outputs back into y.
Status ep_experts_forward(float* y, const float* xp, const int32_t* offsets, const MoeWeights& w, const MoeConfig& c,
                          const MoeExpertGroup& grp) {
  MoeExchange& ex = *grp.exchange;
  MoeEpState& st = *grp.state;
  const int P = ex.size(), Epr = c.E / P, C = c.C, H = c.H;
  TROUPE_TRY(moe_ep_exchange_counts(ex, offsets, c.E, st.recv_rows));
  const MoeEpBlocks b = moe_ep_blocks(offsets, st.recv_rows, P, Epr, C);
  const size_t M = static_cast<size_t>(b.M);
  st.x.resize(M * C), st.buf.resize(M * C), st.g.resize(M * H), st.u.resize(M * H), st.h.resize(M * H);
  TROUPE_TRY(ex.alltoallv(xp, b.send_n.data(), st.x.data(), b.recv_n.data()));
  for_each_ep_block(b, st.recv_rows, ex.rank(), double(M) * C * H, [&](int e, int r0, int n) {
    const size_t R = static_cast<size_t>(r0), we = static_cast<size_t>(e - grp.weights_first_expert) * H * C;
    const ExpertLora la = expert_lora(w.lora, nullptr, e);
    expert_ffn_forward(st.buf.data() + R * C, st.g.data() + R * H, st.u.data() + R * H, st.h.data() + R * H,
                       st.x.data() + R * C, w.w_gate + we, w.w_up + we, w.w_down + we, n, C, H,
                       w.lora.r > 0 ? &la : nullptr);
  });
  return ex.alltoallv(st.buf.data(), b.recv_n.data(), y, b.send_n.data());
}

// Backward: each row's dout and combine weight (C + 1 floats) to the owner, which runs the routed
// expert's backward on the block the forward kept, and each row's dx and d weight (C + 1 floats)
// back: dx into xp, d weight into dw (the row-indexed arrays the unsplit backward fills).
Status ep_experts_backward(float* xp, float* dw, const float* dop, const float* wrow, const int32_t* offsets,
                           const MoeGrads& gr, const MoeWeights& w, const MoeConfig& c, const MoeExpertGroup& grp) {
  MoeExchange& ex = *grp.exchange;
  MoeEpState& st = *grp.state;
  const int P = ex.size(), Epr = c.E / P, C = c.C, H = c.H, W = C + 1, NK = offsets[c.E];
  auto pack = [W, C](float* to, const float* rows, const float* last, size_t n) {
    for (size_t r = 0; r < n; ++r) {
      std::memcpy(to + r * W, rows + r * C, sizeof(float) * C);
      to[r * W + C] = last[r];
    }
  };
  auto unpack = [W, C](float* rows, float* last, const float* from, size_t n) {
    for (size_t r = 0; r < n; ++r) {
      std::memcpy(rows + r * C, from + r * W, sizeof(float) * C);
      last[r] = from[r * W + C];
    }
  };
  const MoeEpBlocks b = moe_ep_blocks(offsets, st.recv_rows, P, Epr, W);
  const size_t M = static_cast<size_t>(b.M), nk = static_cast<size_t>(NK);
  st.rows.resize(nk * W), st.buf.resize(M * W), st.dg.resize(M * H), st.h.resize(M * H);
  pack(st.rows.data(), dop, wrow, nk);
  TROUPE_TRY(ex.alltoallv(st.rows.data(), b.send_n.data(), st.buf.data(), b.recv_n.data()));
  std::vector<float> dop_r(M * C), w_r(M), dw_r(M);
  unpack(dop_r.data(), w_r.data(), st.buf.data(), M);
  for_each_ep_block(b, st.recv_rows, ex.rank(), double(M) * C * H, [&](int e, int r0, int n) {
    const size_t R = static_cast<size_t>(r0), we = static_cast<size_t>(e - grp.weights_first_expert) * H * C;
    const ExpertLora la = expert_lora(w.lora, &gr.lora, e);
    routed_expert_backward(st.x.data() + R * C, dw_r.data() + R, gr.w_gate + we, gr.w_up + we, gr.w_down + we,
                           dop_r.data() + R * C, w_r.data() + R, st.g.data() + R * H, st.u.data() + R * H,
                           w.w_gate + we, w.w_up + we, w.w_down + we, st.h.data() + R * H, st.dg.data() + R * H, n,
                           C, H, w.lora.r > 0 ? &la : nullptr);
  });
  pack(st.buf.data(), st.x.data(), dw_r.data(), M);  // st.x now holds the rows' dx
  TROUPE_TRY(ex.alltoallv(st.buf.data(), b.recv_n.data(), st.rows.data(), b.send_n.data()));
  unpack(xp, dw, st.rows.data(), nk);
  return {};
}

// top_experts/top_weights given (the dispatcher alone): no router, the experts are the identity
// (y = x); else the router picks them and the experts are SwiGLUs.
// ep: the experts split over an expert-parallel group (grouped routing only).
Status forward_impl(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                    const MoeConfig& cfg, int N, float* scratch, const int32_t* route,
                    const int32_t* top_experts = nullptr, const float* top_weights = nullptr,
                    const MoeExpertGroup* ep = nullptr) {
  const bool identity = top_experts != nullptr;
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
  float* xp = scratch + S.xp;
  float* y = scratch + S.yp;
  float* h = scratch + S.h;
  int32_t* cursor = ints_at(scratch + S.counts, static_cast<size_t>(E));  // route plan counts
  const float* yrows = identity ? xp : y;

  if (N == 0) {
    for (int e = 0; e <= E; ++e) offsets[e] = 0;
    router_stats(stats, probs, offsets, cfg, N);
    return ep ? ep_experts_forward(nullptr, nullptr, offsets, w, cfg, *ep) : Status{};
  }
  if (identity) {
    std::memcpy(experts, top_experts, sizeof(int32_t) * static_cast<size_t>(NK));
    std::memcpy(weights, top_weights, sizeof(float) * static_cast<size_t>(NK));
  } else {
    router_forward(probs, experts, weights, inp, w.w_router, cfg, N, route);
  }

  // The shared expert (unweighted) is the starting value of every token's sum; else 0.
  if (cfg.H_shared > 0) {
    expert_ffn_forward(out, saved + L.gs, saved + L.us, scratch + S.hs, inp, w.ws_gate, w.ws_up, w.ws_down, N, C,
                   cfg.H_shared);
  } else if (!cfg.grouped) {  // the grouped combine assigns instead
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(N) * C);
  }

  if (cfg.grouped) {
    moe_route_plan(offsets, row_slot, slot_row, cursor, experts, N, K, E);
    moe_permute(xp, inp, slot_row, N, K, C);
    if (ep)
      TROUPE_TRY(ep_experts_forward(y, xp, offsets, w, cfg, *ep));
    else if (!identity)
      experts_forward_grouped(y, g, u, h, xp, offsets, w, cfg);
    moe_unpermute(out, yrows, weights, slot_row, N, K, C, cfg.H_shared > 0);
  } else {
    // Masked loop: for every expert, scan all assignments, gather, compute, scatter.
    int row = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = row;
      const int end = scan_expert_rows(row_slot, slot_row, e, row, experts, NK);
      const int n = end - row;
      // (the same streaming rule as the grouped permute: this pass writes one expert's rows)
      const bool stream = stream_rows(xp + static_cast<size_t>(row) * C, static_cast<size_t>(n), C);
#pragma omp parallel if (parallel_worth(double(end - row) * C))
      {
#pragma omp for schedule(static) nowait
        for (int r = row; r < end; ++r) {
          if (r + kAhead < end) prefetch_row(inp + static_cast<size_t>(row_slot[r + kAhead] / K) * C, C);
          write_row(xp + static_cast<size_t>(r) * C, inp + static_cast<size_t>(row_slot[r] / K) * C, nullptr, C,
                    stream);
        }
        store_fence(stream);
      }
      const size_t r0 = static_cast<size_t>(row), we = static_cast<size_t>(e) * H * C;
      const ExpertLora la = expert_lora(w.lora, nullptr, e);
      if (!identity)
        expert_ffn_forward(y + r0 * C, g + r0 * H, u + r0 * H, h + r0 * H, xp + r0 * C, w.w_gate + we, w.w_up + we,
                       w.w_down + we, n, C, H, w.lora.r > 0 ? &la : nullptr);
      // Scatter; a token has each expert at most once, so rows of one expert touch distinct tokens.
#pragma omp parallel for schedule(static) if (parallel_worth(double(end - row) * C))
      for (int r = row; r < end; ++r) {
        const int s = row_slot[r];
        if (r + kAhead < end) prefetch_row(out + static_cast<size_t>(row_slot[r + kAhead] / K) * C, C);
        float* o = out + static_cast<size_t>(s / K) * C;
        const float wk = weights[s];
        const float* yr = yrows + static_cast<size_t>(r) * C;
        for (int i = 0; i < C; ++i) o[i] += wk * yr[i];
      }
      row = end;
    }
    offsets[E] = row;
  }
  if (!identity) router_stats(stats, probs, offsets, cfg, N);
  return {};
}

// Gathers permuted row r: its input (unless identity), its dout row (scaled by its weight when
// identity, where that is already d(expert input)) and its weight. stream: streaming stores
// (stream_rows of the rows the pass writes).
inline void gather_backward_row(float* xp, float* dop, float* wrow, int r, int s, int ahead_s,
                                const float* inp, const float* dout, const float* weights, int K, int C,
                                bool identity, bool stream) {
  if (ahead_s >= 0) {  // the slot of the row kAhead further on
    prefetch_row(dout + static_cast<size_t>(ahead_s / K) * C, C);
    if (!identity) prefetch_row(inp + static_cast<size_t>(ahead_s / K) * C, C);
  }
  const size_t t = static_cast<size_t>(s / K);
  float* dr = dop + static_cast<size_t>(r) * C;
  wrow[r] = weights[s];
  if (identity) {
    write_row(dr, dout + t * C, weights + s, C, stream);
  } else {
    write_row(xp + static_cast<size_t>(r) * C, inp + t * C, nullptr, C, stream);
    write_row(dr, dout + t * C, nullptr, C, stream);
  }
}

// The router's backward: d weights (dw, per row) -> d probs (renormalization, aux loss) -> d logits
// (softmax, into dp) -> dWr (accumulated into w_router's gradient) and dinp (accumulated).
void router_backward(float* dinp, float* dw_router, const float* dw, float* dp, float daux, const float* inp,
                     const float* probs, const float* weights, const int32_t* experts, const int32_t* offsets,
                     const int32_t* slot_row, const MoeWeights& w, const MoeConfig& cfg, int N) {
  const int E = cfg.E, K = cfg.K, C = cfg.C;
  const float aux_scale = daux * static_cast<float>(E) / (static_cast<float>(N) * static_cast<float>(N));
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * E * 4))
  for (int t = 0; t < N; ++t) {
    float* d = dp + static_cast<size_t>(t) * E;
    const float* p = probs + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; ++e) d[e] = daux != 0.0f ? aux_scale * static_cast<float>(offsets[e + 1] - offsets[e]) : 0.0f;
    const int32_t* ex = experts + static_cast<size_t>(t) * K;
    auto dws = [&](int k) { return dw[slot_row[t * K + k]]; };
    if (cfg.renormalize) {
      float s = 0, dot = 0;
      for (int k = 0; k < K; ++k) s += p[ex[k]];
      for (int k = 0; k < K; ++k) dot += dws(k) * weights[t * K + k];
      for (int k = 0; k < K; ++k) d[ex[k]] += (dws(k) - dot) / s;
    } else {
      for (int k = 0; k < K; ++k) d[ex[k]] += dws(k);
    }
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += d[e] * p[e];
    for (int e = 0; e < E; ++e) d[e] = p[e] * (d[e] - dot);
  }
  sgemm(CblasTrans, CblasNoTrans, E, C, N, 1.0f, dp, E, inp, C, 1.0f, dw_router, C);
  sgemm(CblasNoTrans, CblasNoTrans, N, C, E, 1.0f, dp, E, w.w_router, C, 1.0f, dinp, C);
}

// dweights given (the dispatcher alone, identity experts): d loss / d weights is written there and
// the router backward is skipped.
// ep: as forward_impl's.
Status backward_impl(float* dinp, const MoeGrads& gr, const float* dout, float daux, const float* inp,
                     const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch,
                     float* dweights = nullptr, const MoeExpertGroup* ep = nullptr) {
  const bool identity = dweights != nullptr;
  const SavedLayout L = saved_layout(cfg, N);
  const BackwardScratch S = backward_scratch(cfg, N);
  const int E = cfg.E, K = cfg.K, C = cfg.C, H = cfg.H, NK = N * K;
  if (N == 0) {
    if (!ep) return {};
    const std::vector<int32_t> none(static_cast<size_t>(E) + 1, 0);
    return ep_experts_backward(nullptr, nullptr, nullptr, nullptr, none.data(), gr, w, cfg, *ep);
  }
  const float* probs = saved + L.probs;
  const float* weights = saved + L.weights;
  const int32_t* experts = ints_at(saved + L.experts);
  const int32_t* offsets = ints_at(saved + L.offsets);
  const int32_t* slot_row = ints_at(saved + L.slot_row);
  const float* g = saved + L.g;
  const float* u = saved + L.u;
  float* xp = scratch + S.xp;    // expert inputs, then their dx
  float* dop = scratch + S.dop;  // dout rows (identity: d of the expert input)
  float* h = scratch + S.h;
  float* dg = scratch + S.dg;
  float* dw = scratch + S.dw;    // per row: d weight
  float* wrow = scratch + S.wrow;
  float* dp = scratch + S.dp;
  const float* dxrows = identity ? dop : xp;

  // Shared expert first: its dx initializes dinp (same order in both paths).
  if (cfg.H_shared > 0) {
    shared_expert_backward(dinp, gr.ws_gate, gr.ws_up, gr.ws_down, dout, inp, saved + L.gs, saved + L.us, w.ws_gate, w.ws_up,
                    w.ws_down, scratch + S.hs, scratch + S.dgs, N, C, cfg.H_shared);
  } else if (!cfg.grouped) {  // the grouped permute backward assigns instead
    std::memset(dinp, 0, sizeof(float) * static_cast<size_t>(N) * C);
  }

  // One segment of rows [r0, r0+n) of expert e: d weight, expert backward (dx into xp).
  auto segment = [&](int e, int r0, int n) {
    if (identity) return;  // d weight is computed per slot below; dx = dop
    const size_t R = static_cast<size_t>(r0), we = static_cast<size_t>(e) * H * C;
    const ExpertLora la = expert_lora(w.lora, &gr.lora, e);
    routed_expert_backward(xp + R * C, dw + R, gr.w_gate + we, gr.w_up + we, gr.w_down + we, dop + R * C, wrow + R, g + R * H,
                    u + R * H, w.w_gate + we, w.w_up + we, w.w_down + we, h + R * H, dg + R * H, n, C, H,
                    w.lora.r > 0 ? &la : nullptr);
  };

  if (cfg.grouped) {
    // The rows' gather as a walk over the tokens (as moe_permute): each dout (and x) row is read
    // once, in order, and written to its K rows. With identity experts the walk also takes
    // d weight = <y, dout>, y = the token's input, while dout's row is at hand.
    const bool stream = stream_rows(dop, static_cast<size_t>(NK), C);
#pragma omp parallel if (parallel_worth(double(NK) * C))
    {
#pragma omp for schedule(static) nowait
      for (int t = 0; t < N; ++t) {
        for (int k = 0; k < K; ++k)
          gather_backward_row(xp, dop, wrow, slot_row[t * K + k], t * K + k, -1, inp, dout, weights, K, C,
                              identity, stream);
        if (identity) {
          const size_t tc = static_cast<size_t>(t) * C;
          const float d = dot_row(inp + tc, dout + tc, C);
          for (int k = 0; k < K; ++k) dweights[t * K + k] = d;
        }
      }
      store_fence(stream);
    }
    if (ep) {
      TROUPE_TRY(ep_experts_backward(xp, dw, dop, wrow, offsets, gr, w, cfg, *ep));
    } else if (!identity) {
#pragma omp parallel for schedule(dynamic, 1) if (parallel_worth(double(NK) * C * H))
      for (int e = 0; e < E; ++e) segment(e, offsets[e], offsets[e + 1] - offsets[e]);
    }
    // Backward of the permute: each token gathers its K rows in ascending expert order.
    moe_unpermute(dinp, dxrows, nullptr, slot_row, N, K, C, cfg.H_shared > 0);
    if (identity) return {};
  } else {
    // Masked loop mirrored: per expert, rescan the assignments, gather, compute, scatter.
    int32_t* row_slot = ints_at(scratch + S.rows, static_cast<size_t>(NK));
    int row = 0;
    for (int e = 0; e < E; ++e) {
      int end = row;
      for (int s = 0; s < NK; ++s)
        if (experts[s] == e) row_slot[end++] = s;
      const bool stream = stream_rows(dop + static_cast<size_t>(row) * C, static_cast<size_t>(end - row), C);
#pragma omp parallel if (parallel_worth(double(end - row) * C))
      {
#pragma omp for schedule(static) nowait
        for (int r = row; r < end; ++r)
          gather_backward_row(xp, dop, wrow, r, row_slot[r], r + kAhead < end ? row_slot[r + kAhead] : -1, inp,
                              dout, weights, K, C, identity, stream);
        store_fence(stream);
      }
      segment(e, row, end - row);
#pragma omp parallel for schedule(static) if (parallel_worth(double(end - row) * C))
      for (int r = row; r < end; ++r) {
        if (r + kAhead < end) prefetch_row(dinp + static_cast<size_t>(row_slot[r + kAhead] / K) * C, C);
        float* o = dinp + static_cast<size_t>(row_slot[r] / K) * C;
        const float* dr = dxrows + static_cast<size_t>(r) * C;
        for (int i = 0; i < C; ++i) o[i] += dr[i];
      }
      row = end;
    }
  }
  if (identity) {  // masked: d weight = <y, dout> with y = the token's input; no router behind it
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
    for (int t = 0; t < N; ++t) {
      const float d = dot_row(inp + static_cast<size_t>(t) * C, dout + static_cast<size_t>(t) * C, C);
      for (int k = 0; k < K; ++k) dweights[t * K + k] = d;
    }
    return {};
  }

  router_backward(dinp, gr.w_router, dw, dp, daux, inp, probs, weights, experts, offsets, slot_row, w, cfg, N);
  return {};
}

}  // namespace

void moe_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                 const MoeConfig& cfg, int N, float* scratch, const int32_t* route) {
  (void)forward_impl(out, saved, stats, inp, w, cfg, N, scratch, route);  // no exchange: nothing fails
}

void moe_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                  const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch) {
  (void)backward_impl(dinp, g, dout, daux, inp, saved, w, cfg, N, scratch);
}

Status moe_ep_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                      const MoeConfig& cfg, int N, float* scratch, const int32_t* route, const MoeExpertGroup& group) {
  TROUPE_TRY(moe_ep_check_group(cfg, group));
  MoeConfig c = cfg;
  c.grouped = true;
  return forward_impl(out, saved, stats, inp, w, c, N, scratch, route, nullptr, nullptr, &group);
}

Status moe_ep_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                       const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch,
                       const MoeExpertGroup& group) {
  TROUPE_TRY(moe_ep_check_group(cfg, group));
  MoeConfig c = cfg;
  c.grouped = true;
  return backward_impl(dinp, g, dout, daux, inp, saved, w, c, N, scratch, nullptr, &group);
}

Status moe_ep_serve_forward(const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& group) {
  TROUPE_TRY(moe_ep_check_group(cfg, group));
  const std::vector<int32_t> none(static_cast<size_t>(cfg.E) + 1, 0);
  return ep_experts_forward(nullptr, nullptr, none.data(), w, cfg, group);
}

Status moe_ep_serve_backward(const MoeGrads& g, const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& group) {
  TROUPE_TRY(moe_ep_check_group(cfg, group));
  const std::vector<int32_t> none(static_cast<size_t>(cfg.E) + 1, 0);
  return ep_experts_backward(nullptr, nullptr, nullptr, nullptr, none.data(), g, w, cfg, group);
}

void moe_dispatch_forward(float* out, float* saved, const int32_t* experts, const float* weights,
                          const float* inp, const MoeConfig& cfg, int N, float* scratch) {
  MoeConfig c = cfg;
  c.H_shared = 0;
  (void)forward_impl(out, saved, nullptr, inp, MoeWeights{}, c, N, scratch, nullptr, experts, weights);
}

void moe_dispatch_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                           const float* saved, const MoeConfig& cfg, int N, float* scratch) {
  MoeConfig c = cfg;
  c.H_shared = 0;
  (void)backward_impl(dinp, MoeGrads{}, dout, 0.0f, inp, saved, MoeWeights{}, c, N, scratch, dweights);
}

}  // namespace troupe::kernels
