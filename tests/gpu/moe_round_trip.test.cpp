// gpu.moe_round_trip: the MoE dispatcher on the GPU (CUB histogram + scan + stable sort, permute,
// unpermute): the route plan equals the CPU counting sort, the unweighted round trip gives K * x
// and the weighted combine the CPU moe_unpermute; then the whole MoE layer (router, grouped
// experts, shared expert, aux loss) forward and backward against the CPU backend.
#include <vector>

#include "gpu_test.h"
#include "launchers.h"
#include "troupe/kernels/expert_gemm.h"
#include "troupe/kernels/moe.h"

namespace troupe::gpu_test {
namespace {

void round_trip(const k::Backend& g) {
  const int N = 300, K = 2, E = 8, C = 64, NK = N * K;
  std::vector<float> x = randn(size_t(N) * C, 1), w(NK);
  std::vector<int32_t> ex(NK);
  std::mt19937 rng(2);
  for (int t = 0; t < N; ++t) {  // K distinct experts per token, ascending; expert 5 left empty
    int a = int(rng() % E), b = int(rng() % E);
    if (a == 5) a = 4;
    if (b == 5 || b == a) b = (a + 1) % E == 5 ? (a + 2) % E : (a + 1) % E;
    ex[size_t(t) * K] = std::min(a, b), ex[size_t(t) * K + 1] = std::max(a, b);
    w[size_t(t) * K] = 0.3f, w[size_t(t) * K + 1] = 0.7f;
  }
  std::vector<int32_t> off(E + 1), rs(NK), sr(NK), counts(E);
  k::moe_route_plan(off.data(), rs.data(), sr.data(), counts.data(), ex.data(), N, K, E);
  std::vector<float> xp(size_t(NK) * C), comb(x.size()), back(x.size());
  k::moe_permute(xp.data(), x.data(), sr.data(), N, K, C);
  k::moe_unpermute(comb.data(), xp.data(), w.data(), sr.data(), N, K, C, false);
  for (size_t i = 0; i < x.size(); ++i) back[i] = x[i] * K;

  const auto& q = k::cuda::backend_queue(g);
  Dev<float> gx(g, x), gw(g, w), gxp(g, xp.size()), gcomb(g, x.size()), gback(g, x.size());
  Dev<int32_t> gex(g, ex), goff(g, off.size()), grs(g, NK), gsr(g, NK);
  Dev<unsigned char> tmp(g, k::cuda::moe_plan_tmp_bytes(NK, E));
  k::cuda::launch_moe_round_trip(q, gcomb.p(), gback.p(), goff.p(), grs.p(), gsr.p(), gex.p(), gw.p(), gx.p(), N, K, E,
                                 C, gxp.p(), tmp.p());
  GPU_CHECK(goff.host(g) == off, "expert histogram + exclusive scan (CUB) == CPU offsets");
  GPU_CHECK(grs.host(g) == rs, "stable sort by expert (CUB) == CPU row_slot");
  GPU_CHECK(gsr.host(g) == sr, "inverse rows == CPU slot_row");
  expect_near("permute", gxp.host(g), xp, 0, 0);
  expect_near("unpermute (weighted combine)", gcomb.host(g), comb, 1e-6, 1e-6);
  expect_near("round trip (unweighted) == K x", gback.host(g), back, 1e-6, 1e-6);
}

void layer(const k::Backend& g, const k::Backend& c, k::MoeConfig cfg, int N) {
  const size_t C = cfg.C, H = cfg.H, E = cfg.E, Hs = cfg.H_shared;
  auto wr = randn(E * C, 3), wg = randn(E * H * C, 4, 0.1f), wu = randn(E * H * C, 5, 0.1f), wd = randn(E * C * H, 6, 0.1f),
       sg = randn(Hs * C, 7, 0.1f), su = randn(Hs * C, 8, 0.1f), sd = randn(C * Hs, 9, 0.1f), x = randn(N * C, 10),
       dout = randn(N * C, 11);
  Dev<float> gwr(g, wr), gwg(g, wg), gwu(g, wu), gwd(g, wd), gsg(g, sg), gsu(g, su), gsd(g, sd), gx(g, x), gdo(g, dout);
  const k::MoeWeights cw{wr.data(), wg.data(), wu.data(), wd.data(), Hs ? sg.data() : nullptr,
                         Hs ? su.data() : nullptr, Hs ? sd.data() : nullptr, {}};
  const k::MoeWeights gw{gwr.p(), gwg.p(), gwu.p(), gwd.p(), Hs ? gsg.p() : nullptr, Hs ? gsu.p() : nullptr,
                         Hs ? gsd.p() : nullptr, {}};
  std::vector<float> out(x.size()), saved(c.moe_saved_floats(cfg, N)), scr(c.moe_scratch_floats(cfg, N));
  Dev<float> gout(g, x.size()), gsaved(g, g.moe_saved_floats(cfg, N)), gscr(g, g.moe_scratch_floats(cfg, N));
  k::MoeStats cst, gst;
  c.moe_forward(out.data(), saved.data(), &cst, x.data(), cw, cfg, N, scr.data(), nullptr);
  g.moe_forward(gout.p(), gsaved.p(), &gst, gx.p(), gw, cfg, N, gscr.p(), nullptr);
  expect_near("moe_forward", gout.host(g), out, 1e-4, 1e-3);
  GPU_CHECK(std::fabs(cst.aux_loss - gst.aux_loss) < 1e-4f, "moe aux loss");
  GPU_CHECK(cst.max_expert_load == gst.max_expert_load, "moe max expert load");
  std::vector<float> dx(x.size()), dwr(wr.size()), dwg(wg.size()), dwu(wu.size()), dwd(wd.size()), dsg(sg.size()),
      dsu(su.size()), dsd(sd.size());
  Dev<float> gdx(g, x.size()), gdwr(g, wr.size()), gdwg(g, wg.size()), gdwu(g, wu.size()), gdwd(g, wd.size()),
      gdsg(g, sg.size()), gdsu(g, su.size()), gdsd(g, sd.size());
  c.moe_backward(dx.data(), {dwr.data(), dwg.data(), dwu.data(), dwd.data(), dsg.data(), dsu.data(), dsd.data(), {}},
                 dout.data(), 0.01f, x.data(), saved.data(), cw, cfg, N, scr.data());
  g.moe_backward(gdx.p(), {gdwr.p(), gdwg.p(), gdwu.p(), gdwd.p(), gdsg.p(), gdsu.p(), gdsd.p(), {}}, gdo.p(), 0.01f, gx.p(),
                 gsaved.p(), gw, cfg, N, gscr.p());
  expect_near("moe_backward.dinp", gdx.host(g), dx, 1e-4, 1e-3);
  expect_near("moe_backward.w_router", gdwr.host(g), dwr, 1e-3, 1e-3);
  expect_near("moe_backward.w_gate", gdwg.host(g), dwg, 1e-3, 1e-3);
  expect_near("moe_backward.w_down", gdwd.host(g), dwd, 1e-3, 1e-3);
  if (Hs) expect_near("moe_backward.ws_up", gdsu.host(g), dsu, 1e-3, 1e-3);
}

}  // namespace
}  // namespace troupe::gpu_test

int main() {
  using namespace troupe::gpu_test;
  return run_gpu_test("gpu.moe_round_trip", [] {
    const k::Backend& g = cuda();
    round_trip(g);
    // Every way of issuing the experts' GEMMs (expert_gemm.h) against the CPU layer.
    for (k::ExpertGemm m : {k::ExpertGemm::grouped, k::ExpertGemm::streams, k::ExpertGemm::per_expert}) {
      k::set_expert_gemm(m);
      std::printf("experts' GEMMs: %s\n", std::string(k::expert_gemm_name(m)).c_str());
      layer(g, k::cpu_backend(), {64, 32, 8, 2, true, 0, true}, 200);
      layer(g, k::cpu_backend(), {48, 24, 6, 1, false, 16, true}, 130);
      layer(g, k::cpu_backend(), {32, 16, 16, 4, true, 0, true}, 7);  // empty experts: fewer GEMMs than E
    }
    k::set_expert_gemm(k::ExpertGemm::grouped);
  });
}
