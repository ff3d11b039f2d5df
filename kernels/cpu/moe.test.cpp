// Tests of the MoE layer (moe.h): grouped == masked loop bit for bit (top-1/2/4, empty experts,
// all tokens on one expert, shared expert, aux loss), routing correctness, permute/unpermute round
// trip and its gradient, and a central finite-difference check of the whole layer's backward.
#include "troupe/kernels/moe.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace troupe::kernels {
namespace {

struct Layer {
  MoeConfig cfg;
  int N = 0;
  std::vector<float> wr, wg, wu, wd, sg, su, sd, x;
  Layer(MoeConfig c, int n, unsigned seed, float router_scale = 1.0f) : cfg(c), N(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& v, size_t count, float scale) {
      v.resize(count);
      for (auto& f : v) f = nd(rng) * scale;
    };
    const size_t C = c.C, H = c.H, E = c.E, Hs = c.H_shared;
    fill(wr, E * C, router_scale / std::sqrt(static_cast<float>(C)));
    fill(wg, E * H * C, 1.0f / std::sqrt(static_cast<float>(C)));
    fill(wu, E * H * C, 1.0f / std::sqrt(static_cast<float>(C)));
    fill(wd, E * C * H, 1.0f / std::sqrt(static_cast<float>(H)));
    fill(sg, Hs * C, 1.0f / std::sqrt(static_cast<float>(C)));
    fill(su, Hs * C, 1.0f / std::sqrt(static_cast<float>(C)));
    fill(sd, C * Hs, 1.0f / std::sqrt(static_cast<float>(std::max<size_t>(Hs, 1))));
    fill(x, static_cast<size_t>(n) * C, 1.0f);
  }
  MoeWeights weights() const {
    MoeWeights w;
    w.w_router = wr.data();
    w.w_gate = wg.data();
    w.w_up = wu.data();
    w.w_down = wd.data();
    if (cfg.H_shared > 0) {
      w.ws_gate = sg.data();
      w.ws_up = su.data();
      w.ws_down = sd.data();
    }
    return w;
  }
};

struct Result {
  std::vector<float> out, saved, dinp, dwr, dwg, dwu, dwd, dsg, dsu, dsd;
  MoeStats stats;
};

Result run(const Layer& L, bool grouped, const std::vector<float>& dout, float daux, const float* x = nullptr) {
  MoeConfig cfg = L.cfg;
  cfg.grouped = grouped;
  Result r;
  const size_t NC = static_cast<size_t>(L.N) * cfg.C;
  r.out.assign(NC, -7.0f);  // garbage: out and dinp must be assigned, not accumulated
  r.saved.assign(moe_saved_floats(cfg, L.N), -3.0f);
  std::vector<float> scratch(moe_scratch_floats(cfg, L.N), 5.0f);
  const float* inp = x ? x : L.x.data();
  moe_forward(r.out.data(), r.saved.data(), &r.stats, inp, L.weights(), cfg, L.N, scratch.data());
  if (dout.empty()) return r;
  r.dinp.assign(NC, 9.0f);
  // Parameter gradients are accumulated: start them at a known nonzero value.
  r.dwr.assign(L.wr.size(), 0.5f);
  r.dwg.assign(L.wg.size(), 0.5f);
  r.dwu.assign(L.wu.size(), 0.5f);
  r.dwd.assign(L.wd.size(), 0.5f);
  r.dsg.assign(L.sg.size(), 0.5f);
  r.dsu.assign(L.su.size(), 0.5f);
  r.dsd.assign(L.sd.size(), 0.5f);
  MoeGrads g{r.dwr.data(), r.dwg.data(), r.dwu.data(), r.dwd.data(), nullptr, nullptr, nullptr, {}};
  if (cfg.H_shared > 0) {
    g.ws_gate = r.dsg.data();
    g.ws_up = r.dsu.data();
    g.ws_down = r.dsd.data();
  }
  std::fill(scratch.begin(), scratch.end(), 11.0f);
  moe_backward(r.dinp.data(), g, dout.data(), daux, inp, r.saved.data(), L.weights(), cfg, L.N, scratch.data());
  return r;
}

std::vector<float> random_vec(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t first = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      first = i;
      break;
    }
  EXPECT_EQ(first, a.size()) << what << " differs first at " << first << ": " << a[first] << " vs " << b[first];
}

// The output and every gradient of two runs, bit for bit.
void expect_same_bits(const Result& a, const Result& b) {
  expect_bitwise(a.out, b.out, "out");
  expect_bitwise(a.dinp, b.dinp, "dinp");
  expect_bitwise(a.dwr, b.dwr, "d w_router");
  expect_bitwise(a.dwg, b.dwg, "d w_gate");
  expect_bitwise(a.dwu, b.dwu, "d w_up");
  expect_bitwise(a.dwd, b.dwd, "d w_down");
  expect_bitwise(a.dsg, b.dsg, "d ws_gate");
  expect_bitwise(a.dsu, b.dsu, "d ws_up");
  expect_bitwise(a.dsd, b.dsd, "d ws_down");
}

void expect_grouped_equals_masked(const Layer& L, float daux = 0.25f) {
  auto dout = random_vec(static_cast<size_t>(L.N) * L.cfg.C, 99);
  Result a = run(L, true, dout, daux);
  Result b = run(L, false, dout, daux);
  expect_same_bits(a, b);
  // the same plan: offsets and row maps (grouped: the counting sort; masked: a scan per expert)
  auto ra = moe_saved_routing(a.saved.data(), L.cfg, L.N), rb = moe_saved_routing(b.saved.data(), L.cfg, L.N);
  const size_t nk = static_cast<size_t>(L.N) * L.cfg.K;
  EXPECT_TRUE(std::equal(ra.offsets, ra.offsets + L.cfg.E + 1, rb.offsets));
  EXPECT_TRUE(std::equal(ra.row_slot, ra.row_slot + nk, rb.row_slot));
  EXPECT_TRUE(std::equal(ra.slot_row, ra.slot_row + nk, rb.slot_row));
  EXPECT_EQ(a.stats.aux_loss, b.stats.aux_loss);
  EXPECT_EQ(a.stats.max_expert_load, b.stats.max_expert_load);
  EXPECT_EQ(a.stats.empty_experts, b.stats.empty_experts);
  for (float f : a.out) ASSERT_TRUE(std::isfinite(f));
  for (float f : a.dinp) ASSERT_TRUE(std::isfinite(f));
}

MoeConfig config(int C, int H, int E, int K, int Hs = 0, bool renorm = true) {
  MoeConfig c;
  c.C = C;
  c.H = H;
  c.E = E;
  c.K = K;
  c.H_shared = Hs;
  c.renormalize = renorm;
  return c;
}

TEST(Moe, GroupedEqualsMaskedTop1) { expect_grouped_equals_masked(Layer(config(32, 24, 8, 1), 97, 1)); }
TEST(Moe, GroupedEqualsMaskedTop2) { expect_grouped_equals_masked(Layer(config(32, 24, 8, 2), 97, 2)); }
TEST(Moe, GroupedEqualsMaskedTop4) { expect_grouped_equals_masked(Layer(config(32, 24, 8, 4), 97, 3)); }
TEST(Moe, GroupedEqualsMaskedSharedNoRenorm) {
  expect_grouped_equals_masked(Layer(config(32, 24, 8, 2, 40, false), 97, 4));
}
TEST(Moe, GroupedEqualsMaskedManyExperts) { expect_grouped_equals_masked(Layer(config(16, 8, 64, 2), 300, 5)); }
// Big enough that the masked loop splits each expert's GEMMs over threads while the grouped path
// runs one whole GEMM per expert per thread: still bit-identical.
TEST(Moe, GroupedEqualsMaskedLarge) { expect_grouped_equals_masked(Layer(config(64, 64, 4, 2, 32), 2048, 9)); }
// Every GEMM is cut into the same row blocks at any thread count: 1 and 2 threads, both paths,
// give the same bits (a layer large enough that the GEMMs are split over the threads).
TEST(Moe, ThreadCountDoesNotChangeBits) {
  Layer L(config(64, 64, 4, 2, 32), 2048, 11);
  auto dout = random_vec(static_cast<size_t>(L.N) * L.cfg.C, 12);
  const int before = omp_get_max_threads();
  for (bool grouped : {true, false}) {
    omp_set_num_threads(1);
    Result one = run(L, grouped, dout, 0.25f);
    omp_set_num_threads(2);
    Result two = run(L, grouped, dout, 0.25f);
    expect_same_bits(one, two);
  }
  omp_set_num_threads(before);
}
// Sets moe_stream_bytes for a scope: the default depends on this machine's last-level cache, the
// tests pin it so that they run the streaming stores on every machine.
struct StreamBytes {
  size_t before = moe_stream_bytes();
  explicit StreamBytes(size_t bytes) { set_moe_stream_bytes(bytes); }
  ~StreamBytes() { set_moe_stream_bytes(before); }
};
constexpr size_t kSmallCacheStream = size_t(4) << 20;  // the default on a machine with a 16 MiB L3

// Large enough that the grouped permute and combine stream their 4 MB buffers.
TEST(Moe, GroupedEqualsMaskedStreamed) {
  StreamBytes pin(kSmallCacheStream);
  expect_grouped_equals_masked(Layer(config(64, 16, 4, 2), 8192, 21));
}
TEST(Moe, GroupedEqualsMaskedOneToken) { expect_grouped_equals_masked(Layer(config(16, 8, 7, 2), 1, 6)); }

// The dispatcher alone (identity experts, top-k given) is bit-identical between the paths and
// equals its definition: out[t] = sum_k w[t,k] x[t], dinp[t] = sum_k w[t,k] dout[t] (k ascending,
// from 0), d w[t,k] = <x[t], dout[t]> (to rounding: the kernel's dot has its own fixed order).
// Experts are drawn from the first `used` only: the rest stay empty.
void expect_dispatch_equals_definition(int N, int C, int E, int K, int used) {
      MoeConfig base = config(C, 8, E, K);
      std::mt19937 rng(40 + K * 100 + used);
      std::vector<int32_t> experts(static_cast<size_t>(N) * K);
      std::vector<float> weights(experts.size());
      std::uniform_real_distribution<float> uw(0.05f, 1.0f);
      for (int t = 0; t < N; ++t) {
        std::vector<int32_t> pool(static_cast<size_t>(used));
        for (int e = 0; e < used; ++e) pool[static_cast<size_t>(e)] = e;
        std::shuffle(pool.begin(), pool.end(), rng);
        std::sort(pool.begin(), pool.begin() + K);
        for (int k = 0; k < K; ++k) {
          experts[static_cast<size_t>(t) * K + k] = pool[static_cast<size_t>(k)];
          weights[static_cast<size_t>(t) * K + k] = uw(rng);
        }
      }
      auto x = random_vec(static_cast<size_t>(N) * C, 43 + K);
      auto dout = random_vec(static_cast<size_t>(N) * C, 41 + K);
      std::vector<float> ref_out(x.size()), ref_dinp(x.size()), ref_dw(experts.size());
      for (int t = 0; t < N; ++t)
        for (int i = 0; i < C; ++i) {
          float o = 0, d = 0;
          for (int k = 0; k < K; ++k) {
            const float wk = weights[static_cast<size_t>(t) * K + k];
            o += wk * x[static_cast<size_t>(t) * C + i];
            d += wk * dout[static_cast<size_t>(t) * C + i];
          }
          ref_out[static_cast<size_t>(t) * C + i] = o;
          ref_dinp[static_cast<size_t>(t) * C + i] = d;
        }
      for (int s = 0; s < N * K; ++s) {
        float acc = 0;
        for (int i = 0; i < C; ++i)
          acc += x[static_cast<size_t>(s / K) * C + i] * dout[static_cast<size_t>(s / K) * C + i];
        ref_dw[static_cast<size_t>(s)] = acc;
      }
      std::vector<std::vector<float>> dws;  // the dot's order is fixed, not the reference's: paths compared
      for (bool grouped : {true, false}) {
        MoeConfig c = base;
        c.grouped = grouped;
        std::vector<float> out(x.size(), -1.0f), saved(moe_saved_floats(c, N), -3.0f),
            scratch(moe_scratch_floats(c, N), 5.0f), dinp(x.size(), -1.0f), dw(experts.size(), -1.0f);
        moe_dispatch_forward(out.data(), saved.data(), experts.data(), weights.data(), x.data(), c, N,
                             scratch.data());
        moe_dispatch_backward(dinp.data(), dw.data(), dout.data(), x.data(), saved.data(), c, N,
                              scratch.data());
        expect_bitwise(out, ref_out, grouped ? "grouped dispatch out" : "masked dispatch out");
        expect_bitwise(dinp, ref_dinp, grouped ? "grouped dispatch dinp" : "masked dispatch dinp");
        for (size_t i = 0; i < dw.size(); ++i)
          ASSERT_NEAR(dw[i], ref_dw[i], 1e-5 * (1 + std::fabs(ref_dw[i])));
        dws.push_back(dw);
        auto R = moe_saved_routing(saved.data(), c, N);
        for (int e = used; e < E; ++e) EXPECT_EQ(R.offsets[e + 1] - R.offsets[e], 0);
        EXPECT_EQ(R.offsets[E], N * K);
      }
      expect_bitwise(dws[0], dws[1], "dispatch d weights");
}

TEST(Moe, DispatchGroupedEqualsMasked) {
  for (int K : {1, 2, 4})
    for (int used : {16, 5, 4})
      if (used >= K) expect_dispatch_equals_definition(211, 29, 16, K, used);  // C: 3 blocks of 8 + a tail
}
// The benchmark's size. With a 4 MiB threshold the grouped passes (4-8 MB buffers) stream and the
// masked loop's per-expert passes do not; with 0 every aligned pass streams; with SIZE_MAX none
// does: the same bits each time (the definition is checked bitwise).
TEST(Moe, DispatchGroupedEqualsMaskedStreamed) {
  for (size_t bytes : {kSmallCacheStream, size_t(0), SIZE_MAX}) {
    StreamBytes pin(bytes);
    expect_dispatch_equals_definition(8192, 128, 16, 2, 16);
  }
}
TEST(Moe, StreamBytesDefaultFollowsTheCache) {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const long llc = l3 > 0 ? l3 : l2;
  if (llc > 0) {
    EXPECT_EQ(moe_stream_bytes(), std::max(kSmallCacheStream, static_cast<size_t>(llc) / 4)) << "LLC " << llc;
  }
  EXPECT_GE(moe_stream_bytes(), kSmallCacheStream);
  {
    StreamBytes pin(123);
    EXPECT_EQ(moe_stream_bytes(), 123u);
  }
  EXPECT_GE(moe_stream_bytes(), kSmallCacheStream);
}

// Inputs positive, router rows of experts >= 3 strongly negative: those experts get no tokens.
TEST(Moe, EmptyExperts) {
  Layer L(config(16, 12, 8, 2), 64, 7);
  for (auto& v : L.x) v = std::fabs(v);
  for (int e = 3; e < 8; ++e)
    for (int c = 0; c < 16; ++c) L.wr[static_cast<size_t>(e) * 16 + c] = -2.0f;
  expect_grouped_equals_masked(L);
  Result r = run(L, true, {}, 0);
  EXPECT_EQ(r.stats.empty_experts, 5);
  auto R = moe_saved_routing(r.saved.data(), L.cfg, L.N);
  for (int e = 3; e < 8; ++e) EXPECT_EQ(R.offsets[e + 1] - R.offsets[e], 0);
}

// Top-1 with expert 0 dominant: every token on one expert, the others empty.
TEST(Moe, AllTokensOnOneExpert) {
  for (int K : {1, 2}) {
    Layer L(config(16, 12, 8, K), 50, 8);
    for (auto& v : L.x) v = std::fabs(v);
    for (int c = 0; c < 16; ++c) L.wr[c] = 5.0f;
    expect_grouped_equals_masked(L);
    Result r = run(L, true, {}, 0);
    EXPECT_EQ(r.stats.max_expert_load, 50);
    if (K == 1) {
      EXPECT_EQ(r.stats.empty_experts, 7);
    }
    auto R = moe_saved_routing(r.saved.data(), L.cfg, L.N);
    EXPECT_EQ(R.offsets[1], 50);
  }
}

// Each token reaches exactly its top-k experts (recomputed here in double, ties to the lower id),
// segments hold exactly those tokens in ascending order, and the weights are the (renormalized) probs.
TEST(Moe, EachTokenReachesItsTopK) {
  for (int K : {1, 2, 4}) {
    Layer L(config(16, 8, 8, K), 77, 10 + K);
    Result r = run(L, true, {}, 0);
    auto R = moe_saved_routing(r.saved.data(), L.cfg, L.N);
    for (int t = 0; t < L.N; ++t) {
      std::vector<std::pair<double, int>> logits;
      for (int e = 0; e < 8; ++e) {
        double z = 0;
        for (int c = 0; c < 16; ++c) z += double(L.x[t * 16 + c]) * L.wr[e * 16 + c];
        logits.push_back({-z, e});
      }
      std::sort(logits.begin(), logits.end());
      std::vector<int> want;
      for (int k = 0; k < K; ++k) want.push_back(logits[k].second);
      std::sort(want.begin(), want.end());
      double psum = 0;
      for (int k = 0; k < K; ++k) {
        ASSERT_EQ(R.experts[t * K + k], want[k]) << "token " << t;
        psum += R.probs[t * 8 + want[k]];
      }
      double wsum = 0;
      for (int k = 0; k < K; ++k) {
        EXPECT_NEAR(R.weights[t * K + k], R.probs[t * 8 + want[k]] / psum, 1e-6);
        wsum += R.weights[t * K + k];
        const int row = R.slot_row[t * K + k];
        EXPECT_GE(row, R.offsets[want[k]]);
        EXPECT_LT(row, R.offsets[want[k] + 1]);
        EXPECT_EQ(R.row_slot[row], t * K + k);
      }
      EXPECT_NEAR(wsum, 1.0, 1e-6);
    }
    EXPECT_EQ(R.offsets[8], L.N * K);
    for (int e = 0; e < 8; ++e)
      for (int row = R.offsets[e] + 1; row < R.offsets[e + 1]; ++row)
        EXPECT_LT(R.row_slot[row - 1], R.row_slot[row]) << "stable order within expert " << e;
  }
}

TEST(Moe, TopKTiesGoToLowerIndex) {
  Layer L(config(4, 4, 6, 2), 3, 12);
  std::fill(L.wr.begin(), L.wr.end(), 0.0f);  // all logits equal
  Result r = run(L, true, {}, 0);
  auto R = moe_saved_routing(r.saved.data(), L.cfg, L.N);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(R.experts[t * 2], 0);
    EXPECT_EQ(R.experts[t * 2 + 1], 1);
  }
}

// permute -> unpermute with weights 1/K returns x bit for bit (K a power of two), and the gradient
// of the round trip (unpermute's backward = permute of dout * w, permute's backward = unpermute
// with w = 1) returns dout.
TEST(Moe, PermuteUnpermuteRoundTrip) {
  for (int K : {1, 2, 4}) {
    const int N = 53, C = 12, E = 8;
    std::mt19937 rng(K);
    std::vector<int32_t> experts(static_cast<size_t>(N) * K);
    for (int t = 0; t < N; ++t) {
      std::vector<int> all(E);
      for (int e = 0; e < E; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), rng);
      std::sort(all.begin(), all.begin() + K);
      for (int k = 0; k < K; ++k) experts[t * K + k] = all[k];
    }
    std::vector<int32_t> offsets(E + 1), row_slot(N * K), slot_row(N * K), counts(E);
    moe_route_plan(offsets.data(), row_slot.data(), slot_row.data(), counts.data(), experts.data(), N, K, E);
    for (int s = 0; s < N * K; ++s) ASSERT_EQ(row_slot[slot_row[s]], s);
    auto x = random_vec(static_cast<size_t>(N) * C, 20 + K);
    std::vector<float> xp(static_cast<size_t>(N) * K * C), back(x.size(), 0.0f), w(N * K, 1.0f / K);
    moe_permute(xp.data(), x.data(), slot_row.data(), N, K, C);
    for (int r = 0; r < N * K; ++r)  // the definition: row r holds the input of its token
      for (int c = 0; c < C; ++c)
        ASSERT_EQ(xp[static_cast<size_t>(r) * C + c], x[static_cast<size_t>(row_slot[r] / K) * C + c]) << r;
    moe_unpermute(back.data(), xp.data(), w.data(), slot_row.data(), N, K, C);
    expect_bitwise(back, x, "unpermute(permute(x))");
    // Gradient of the round trip.
    auto dout = random_vec(x.size(), 40 + K);
    std::vector<float> dyp(xp.size()), dx(x.size(), 0.0f);
    moe_permute(dyp.data(), dout.data(), slot_row.data(), N, K, C);
    for (int r = 0; r < N * K; ++r)
      for (int c = 0; c < C; ++c) dyp[static_cast<size_t>(r) * C + c] *= w[row_slot[r]];
    moe_unpermute(dx.data(), dyp.data(), nullptr, slot_row.data(), N, K, C);
    expect_bitwise(dx, dout, "gradient of the round trip");
  }
}

// Central finite differences of L = sum(out * R) + daux * aux_loss against moe_backward, on a tiny
// layer. fp32 forward, so tolerance |fd - an| <= 2e-3 + 2e-2 |an|; coordinates whose perturbation
// changes the routing (top-k is not differentiable there) are skipped.
TEST(Moe, FiniteDifferenceGradient) {
  for (int variant = 0; variant < 3; ++variant) {
    MoeConfig c = config(6, 5, 4, variant == 0 ? 1 : 2, variant == 2 ? 4 : 0, variant != 1);
    Layer L(c, 7, 30 + variant, 3.0f);
    const float daux = 0.7f;
    auto R = random_vec(static_cast<size_t>(L.N) * c.C, 50 + variant);
    Result base = run(L, true, R, daux);
    auto routing_of = [&](const Result& r) {
      auto rt = moe_saved_routing(r.saved.data(), c, L.N);
      return std::vector<int32_t>(rt.experts, rt.experts + L.N * c.K);
    };
    const auto base_routing = routing_of(base);
    auto loss = [&](Layer& layer, std::vector<int32_t>* routing) {
      Result r = run(layer, true, {}, 0);
      if (routing) *routing = routing_of(r);
      double l = 0;
      for (size_t i = 0; i < r.out.size(); ++i) l += double(r.out[i]) * R[i];
      return l + double(daux) * r.stats.aux_loss;
    };
    auto check = [&](std::vector<float>& param, const std::vector<float>& grad, const char* name) {
      int checked = 0;
      for (size_t i = 0; i < param.size(); ++i) {
        const float keep = param[i], eps = 1e-2f;
        std::vector<int32_t> r1, r2;
        param[i] = keep + eps;
        double lp = loss(L, &r1);
        param[i] = keep - eps;
        double lm = loss(L, &r2);
        param[i] = keep;
        if (r1 != base_routing || r2 != base_routing) continue;
        const double fd = (lp - lm) / (2.0 * eps);
        const double an = grad[i] - 0.5;  // grads started at 0.5 (accumulation)
        EXPECT_NEAR(an, fd, 2e-3 + 2e-2 * std::fabs(an)) << name << "[" << i << "] variant " << variant;
        ++checked;
      }
      EXPECT_GT(checked, static_cast<int>(param.size()) / 2) << name;
    };
    check(L.wr, base.dwr, "w_router");
    check(L.wg, base.dwg, "w_gate");
    check(L.wu, base.dwu, "w_up");
    check(L.wd, base.dwd, "w_down");
    if (c.H_shared > 0) {
      check(L.sg, base.dsg, "ws_gate");
      check(L.su, base.dsu, "ws_up");
      check(L.sd, base.dsd, "ws_down");
    }
    // dinp is assigned, not accumulated.
    std::vector<float> dx(base.dinp.size());
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = base.dinp[i] + 0.5f;
    check(L.x, dx, "inp");
  }
}

TEST(Moe, ZeroTokens) {
  Layer L(config(8, 4, 4, 2), 0, 13);
  Result r = run(L, true, std::vector<float>{}, 0);
  EXPECT_EQ(r.stats.max_expert_load, 0);
}

}  // namespace
}  // namespace troupe::kernels
