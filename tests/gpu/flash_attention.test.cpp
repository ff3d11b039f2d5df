// gpu.flash_attention: the device twin of kernels.cuda_flash_attention: the CUDA backend's
// attention ops (the FlashAttention-2 tile kernels and split-K decode) against the CPU backend on
// causal, GQA and MHA, packed odd-length sequences, head sizes 32, 64 and 128, and decode lengths
// around the split size. Skipped (77) without a GPU.
#include <algorithm>
#include <string>
#include <vector>

#include "gpu_test.h"

namespace troupe::gpu_test {
namespace {

using V = std::vector<float>;
using I = std::vector<int32_t>;

void packed(const k::Backend& g, const k::Backend& c, const I& cu, int NH, int NKV, int HD, unsigned seed) {
  const int S = static_cast<int>(cu.size()) - 1, N = cu.back();
  int L = 1;
  for (int s = 0; s < S; ++s) L = std::max(L, cu[size_t(s) + 1] - cu[size_t(s)]);
  const std::string tag = " N=" + std::to_string(N) + " HD=" + std::to_string(HD) + " NH=" + std::to_string(NH) +
                          " NKV=" + std::to_string(NKV);
  const size_t nq = size_t(N) * NH * HD, nk = size_t(N) * NKV * HD;
  V q = randn(nq, seed), kk = randn(nk, seed + 1), v = randn(nk, seed + 2), dout = randn(nq, seed + 3);
  V scratch(c.attention_scratch_floats(L)), out(nq), lse(size_t(N) * NH), dq(nq), dk(nk), dv(nk);
  Dev<float> gq(g, q), gk(g, kk), gv(g, v), gd(g, dout), gout(g, nq), glse(g, lse.size()), gdq(g, nq), gdk(g, nk),
      gdv(g, nk), gscr(g, g.attention_scratch_floats(L));
  Dev<int32_t> gcu(g, cu);
  c.attention_forward(out.data(), lse.data(), scratch.data(), scratch.size(), q.data(), kk.data(), v.data(), cu.data(),
                      S, L, N, NH, NKV, HD);
  g.attention_forward(gout.p(), glse.p(), gscr.p(), gscr.n, gq.p(), gk.p(), gv.p(), gcu.p(), S, L, N, NH, NKV, HD);
  expect_near("attention_forward" + tag, gout.host(g), out, 1e-5, 1e-4);
  expect_near("attention_forward.lse" + tag, glse.host(g), lse, 1e-5, 1e-5);
  c.attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), scratch.size(), dout.data(), q.data(), kk.data(),
                       v.data(), out.data(), lse.data(), cu.data(), S, L, N, NH, NKV, HD);
  g.attention_backward(gdq.p(), gdk.p(), gdv.p(), gscr.p(), gscr.n, gd.p(), gq.p(), gk.p(), gv.p(), gout.p(), glse.p(),
                       gcu.p(), S, L, N, NH, NKV, HD);
  expect_near("attention_backward.dq" + tag, gdq.host(g), dq, 1e-4, 1e-3);
  expect_near("attention_backward.dk" + tag, gdk.host(g), dk, 1e-4, 1e-3);
  expect_near("attention_backward.dv" + tag, gdv.host(g), dv, 1e-4, 1e-3);
}

void decode(const k::Backend& g, const k::Backend& c) {
  const int cache_len = 130, NH = 4, NKV = 2, HD = 64;
  const I kvl = {0, 1, 63, 64, 65, 128, 129, 130}, bs = {3, 0, 7, 1, 6, 2, 5, 4};
  const int B = static_cast<int>(kvl.size()), slots = B;
  V kc = randn(size_t(slots) * cache_len * NKV * HD, 60), vc = randn(kc.size(), 61), q = randn(size_t(B) * NH * HD, 62);
  V out(q.size());
  Dev<float> gkc(g, kc), gvc(g, vc), gq(g, q), gout(g, q.size());
  Dev<int32_t> gkvl(g, kvl), gbs(g, bs);
  c.attention_decode_forward(out.data(), q.data(), kc.data(), vc.data(), kvl.data(), bs.data(), B, cache_len, NH, NKV,
                             HD);
  g.attention_decode_forward(gout.p(), gq.p(), gkc.p(), gvc.p(), gkvl.p(), gbs.p(), B, cache_len, NH, NKV, HD);
  expect_near("attention_decode_forward (split-K)", gout.host(g), out, 1e-5, 1e-4);
}

}  // namespace
}  // namespace troupe::gpu_test

int main() {
  using namespace troupe::gpu_test;
  return run_gpu_test("gpu.flash_attention", [] {
    const k::Backend& g = cuda();
    const k::Backend& c = k::cpu_backend();
    unsigned seed = 1;
    for (const I& cu : {I{0, 37, 42, 113}, I{0, 300}, I{0, 5, 5, 6, 14}})
      for (int HD : {32, 64, 128})
        for (auto [NH, NKV] : {std::pair{4, 2}, std::pair{2, 2}}) {
          packed(g, c, cu, NH, NKV, HD, seed);
          seed += 4;
        }
    decode(g, c);
  });
}
