// kernels.cuda_flash_attention: the FlashAttention-2 tile bodies and split-K decode
// (bodies/flash_attention.h) run on the CPU by host_grid.h against the CPU attention ops (ops.h):
// causal, GQA and MHA, packed sequences of odd lengths, several tiles and lane counts, gradients
// also against central finite differences. Checks indexing and math; no GPU runs here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "bodies/flash_attention.h"
#include "bodies/host_grid.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels::cuda {
namespace {

namespace k = troupe::kernels;
using V = std::vector<float>;

V randn(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  V v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

void expect_near(const char* what, const V& got, const V& ref, double atol, double rtol) {
  ASSERT_EQ(got.size(), ref.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::fabs(got[i] - ref[i]) <= atol + rtol * std::fabs(ref[i]))) {
      ++bad;
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", CPU op " << ref[i];
    }
}

struct Case {
  std::vector<int32_t> cu;
  int NH, NKV, HD, tile;
};

struct Grads {
  V out, lse, dq, dk, dv;
};

int total(const Case& c) { return c.cu.back(); }
int longest(const Case& c) {
  int L = 1;
  for (size_t s = 0; s + 1 < c.cu.size(); ++s) L = std::max(L, c.cu[s + 1] - c.cu[s]);
  return L;
}

// Forward and backward through the tile bodies on `lanes` host threads per block.
Grads flash(const Case& c, const V& q, const V& kk, const V& v, const V& dout, int lanes) {
  const int N = total(c), S = static_cast<int>(c.cu.size()) - 1;
  const FlashShape sh{c.cu.data(), S, N, c.NH, c.NKV, c.HD, c.tile};
  Grads g{V(q.size()), V(static_cast<size_t>(N) * c.NH), V(q.size()), V(kk.size()), V(v.size())};
  host_for_blocks(FlashForwardBody{g.out.data(), g.lse.data(), q.data(), kk.data(), v.data(), sh}, lanes,
                  flash_forward_floats(c.tile, c.HD) * sizeof(float));
  const AttnGrads in{dout.data(), q.data(), kk.data(), v.data(), g.out.data(), g.lse.data()};
  const size_t bytes = flash_backward_floats(c.tile, c.HD) * sizeof(float);
  host_for_blocks(FlashBackwardDkDvBody{g.dk.data(), g.dv.data(), in, sh}, lanes, bytes);
  host_for_blocks(FlashBackwardDqBody{g.dq.data(), in, sh}, lanes, bytes);
  return g;
}

// The CPU op (the specification) on the same inputs.
Grads cpu_op(const Case& c, const V& q, const V& kk, const V& v, const V& dout) {
  const int N = total(c), S = static_cast<int>(c.cu.size()) - 1, L = longest(c);
  Grads g{V(q.size()), V(static_cast<size_t>(N) * c.NH), V(q.size()), V(kk.size()), V(v.size())};
  V scratch(k::attention_scratch_floats(L, 1));
  k::attention_forward(g.out.data(), g.lse.data(), scratch.data(), scratch.size(), q.data(), kk.data(), v.data(),
                       c.cu.data(), S, L, N, c.NH, c.NKV, c.HD);
  k::attention_backward(g.dq.data(), g.dk.data(), g.dv.data(), scratch.data(), scratch.size(), dout.data(), q.data(),
                        kk.data(), v.data(), g.out.data(), g.lse.data(), c.cu.data(), S, L, N, c.NH, c.NKV, c.HD);
  return g;
}

TEST(CudaFlashAttention, MatchesCpuOp) {
  const std::vector<int32_t> packed = {0, 37, 42, 113};  // three sequences of odd lengths
  const std::vector<int32_t> one = {0, 75};              // plain causal
  const std::vector<int32_t> edge = {0, 5, 5, 6, 14};    // an empty and a one-token sequence
  int seed = 1;
  for (const auto& cu : {packed, one, edge})
    for (int HD : {32, 64})
      for (auto [NH, NKV] : {std::pair{4, 2}, std::pair{2, 2}})
        for (int tile : {flash_tile(HD), 16}) {
          const Case c{cu, NH, NKV, HD, tile};
          SCOPED_TRACE(::testing::Message() << "N=" << total(c) << " HD=" << HD << " NH=" << NH << " NKV=" << NKV
                                            << " tile=" << tile);
          const size_t nq = static_cast<size_t>(total(c)) * NH * HD, nk = static_cast<size_t>(total(c)) * NKV * HD;
          const V q = randn(nq, seed), kk = randn(nk, seed + 1), v = randn(nk, seed + 2), dout = randn(nq, seed + 3);
          seed += 4;
          const Grads ref = cpu_op(c, q, kk, v, dout);
          const Grads got = flash(c, q, kk, v, dout, 5);
          expect_near("out", got.out, ref.out, 1e-5, 1e-4);
          expect_near("lse", got.lse, ref.lse, 1e-5, 1e-5);
          expect_near("dq", got.dq, ref.dq, 2e-5, 2e-4);
          expect_near("dk", got.dk, ref.dk, 2e-5, 2e-4);
          expect_near("dv", got.dv, ref.dv, 2e-5, 2e-4);
        }
}

// Each output element's reductions run inside one lane, so the lane count changes no bit.
TEST(CudaFlashAttention, LaneCountInvariant) {
  const Case c{{0, 19, 20, 53}, 4, 2, 32, 16};
  const size_t nq = static_cast<size_t>(total(c)) * c.NH * c.HD, nk = static_cast<size_t>(total(c)) * c.NKV * c.HD;
  const V q = randn(nq, 90), kk = randn(nk, 91), v = randn(nk, 92), dout = randn(nq, 93);
  const Grads a = flash(c, q, kk, v, dout, 1);
  for (int lanes : {7, 32}) {
    const Grads b = flash(c, q, kk, v, dout, lanes);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_EQ(a.dq, b.dq);
    EXPECT_EQ(a.dk, b.dk);
    EXPECT_EQ(a.dv, b.dv);
  }
}

// loss = sum(out * W): the backward with dout = W against central differences of the forward.
TEST(CudaFlashAttention, GradientsMatchFiniteDifferences) {
  const Case c{{0, 2, 5}, 2, 1, 4, 2};
  const size_t nq = static_cast<size_t>(total(c)) * c.NH * c.HD, nk = static_cast<size_t>(total(c)) * c.NKV * c.HD;
  V q = randn(nq, 70), kk = randn(nk, 71), v = randn(nk, 72);
  const V w = randn(nq, 73);
  const Grads g = flash(c, q, kk, v, w, 3);
  auto loss = [&] {
    const Grads f = flash(c, q, kk, v, w, 1);
    double s = 0;
    for (size_t i = 0; i < nq; ++i) s += static_cast<double>(f.out[i]) * w[i];
    return s;
  };
  const float eps = 1e-2f;
  for (auto [x, grad, name] : {std::tuple{&q, &g.dq, "dq"}, std::tuple{&kk, &g.dk, "dk"}, std::tuple{&v, &g.dv, "dv"}})
    for (size_t i = 0; i < x->size(); ++i) {
      const float x0 = (*x)[i];
      (*x)[i] = x0 + eps;
      const double up = loss();
      (*x)[i] = x0 - eps;
      const double down = loss();
      (*x)[i] = x0;
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR((*grad)[i], fd, 5e-3 + 1e-2 * std::fabs(fd)) << name << "[" << i << "]";
    }
}

// Split-K decode (partials, then the combine) against the CPU op, with kv lengths around the split.
void check_decode(int split, const std::vector<int32_t>& kv_len, int cache_len) {
  const int B = static_cast<int>(kv_len.size()), NH = 4, NKV = 2, HD = 32, slots = B + 1;
  const size_t nc = static_cast<size_t>(slots) * cache_len * NKV * HD;
  const V kc = randn(nc, 50), vc = randn(nc, 51), q = randn(static_cast<size_t>(B) * NH * HD, 52);
  std::vector<int32_t> slot(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) slot[static_cast<size_t>(b)] = (b * 3 + 1) % slots;
  const int splits = (cache_len + split - 1) / split;
  const size_t parts = static_cast<size_t>(B) * NH * splits;
  for (const int32_t* sl : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(slot.data())}) {
    V acc(parts * HD), m(parts), l(parts), out(static_cast<size_t>(B) * NH * HD), ref(out.size());
    const DecodePartials part{acc.data(), m.data(), l.data()};
    host_for_each(DecodeSplitBody{part, q.data(), kc.data(), vc.data(), kv_len.data(), sl, cache_len, NH, NKV, HD,
                                  split, splits},
                  parts);
    host_for_each(DecodeCombineBody{out.data(), part, HD, splits}, out.size());
    k::attention_decode_forward(ref.data(), q.data(), kc.data(), vc.data(), kv_len.data(), sl, B, cache_len, NH, NKV,
                                HD);
    expect_near("decode", out, ref, 1e-5, 1e-4);
  }
}

TEST(CudaFlashAttention, SplitKDecode) {
  check_decode(kDecodeSplit, {0, 1, 63, 64, 65, 128, 129, 130}, 130);
  check_decode(8, {7, 8, 9, 16, 17, 0, 1}, 17);
  check_decode(8, {5, 3}, 6);  // a single split
}

}  // namespace
}  // namespace troupe::kernels::cuda
