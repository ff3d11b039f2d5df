// `troupe bench kernels`: the three training optimizations (issue 6) measured on vs off.
// moe_* cases time the MoE kernels alone (8k tokens, top-2); the step cases time a full training
// step of the policy model with its switches. Ours and the baseline are interleaved per repetition.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench.h"
#include "troupe/kernels/moe.h"

namespace troupe::bench {
namespace {

constexpr const char* kSuite = "kernels";

std::vector<float> random_vec(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

// One MoE layer's buffers at bench size.
struct MoeBench {
  kernels::MoeConfig cfg;
  int N;
  std::vector<float> x, wr, wg, wu, wd, out, saved, scratch, dout, dinp, dwr, dwg, dwu, dwd;
  MoeBench(int E, int N_, int C, int H) : N(N_) {
    cfg.C = C;
    cfg.H = H;
    cfg.E = E;
    cfg.K = 2;
    const size_t NC = static_cast<size_t>(N) * C, EHC = static_cast<size_t>(E) * H * C;
    x = random_vec(NC, 1, 1.0f);
    wr = random_vec(static_cast<size_t>(E) * C, 2, 0.1f);
    wg = random_vec(EHC, 3, 0.06f);
    wu = random_vec(EHC, 4, 0.06f);
    wd = random_vec(EHC, 5, 0.06f);
    dout = random_vec(NC, 6, 1.0f);
    out.resize(NC);
    dinp.resize(NC);
    dwr.assign(wr.size(), 0.0f);
    dwg.assign(EHC, 0.0f);
    dwu.assign(EHC, 0.0f);
    dwd.assign(EHC, 0.0f);
    saved.resize(kernels::moe_saved_floats(cfg, N));
    scratch.resize(kernels::moe_scratch_floats(cfg, N));
  }
  // Seconds for one forward + backward.
  double layer(bool grouped) {
    cfg.grouped = grouped;
    kernels::MoeWeights w{wr.data(), wg.data(), wu.data(), wd.data(), nullptr, nullptr, nullptr};
    kernels::MoeGrads g{dwr.data(), dwg.data(), dwu.data(), dwd.data(), nullptr, nullptr, nullptr};
    return time_s([&] {
      kernels::moe_forward(out.data(), saved.data(), nullptr, x.data(), w, cfg, N, scratch.data());
      kernels::moe_backward(dinp.data(), g, dout.data(), 0.0f, x.data(), saved.data(), w, cfg, N, scratch.data());
    });
  }
  double dispatch(bool grouped) {
    cfg.grouped = grouped;
    return time_s([&] {
      kernels::moe_dispatch_forward(out.data(), saved.data(), nullptr, x.data(), wr.data(), cfg, N, scratch.data());
      kernels::moe_dispatch_backward(dinp.data(), dwr.data(), dout.data(), 0.0f, x.data(), saved.data(), wr.data(), cfg,
                                     N, scratch.data());
    });
  }
};

void moe_cases(const BenchOptions& opt, int reps) {
  const int N = 8192, C = 128, H = 128;  // the policy tiny MoE: d_model 128, moe_intermediate_size 128
  for (int E : {8, 32, 64}) {
    const std::string dcase = "moe_dispatch_e" + std::to_string(E);
    const std::string lcase = "moe_layer_e" + std::to_string(E);
    if (!opt.wants(dcase) && !opt.wants(lcase)) continue;
    MoeBench b(E, N, C, H);
    nlohmann::json extra = {{"tokens", N}, {"top_k", 2}, {"experts", E}, {"d_model", C}, {"expert_hidden", H},
                            {"scans_per_layer_ours", 1}, {"scans_per_layer_baseline", E}};
    if (opt.wants(dcase)) {
      b.dispatch(true);
      b.dispatch(false);
      Paired p = interleaved(reps, [&] { return b.dispatch(true) * 1e3; }, [&] { return b.dispatch(false) * 1e3; });
      Row r{kSuite, dcase, "ms", "ms", p.ours, p.baseline, "masked_loop", Better::lower, extra};
      r.extra["what"] = "router + top-k + permute + unpermute/combine, forward and backward (identity experts)";
      emit(r);
    }
    if (opt.wants(lcase)) {
      b.layer(true);
      b.layer(false);
      Paired p = interleaved(reps, [&] { return b.layer(true) * 1e3; }, [&] { return b.layer(false) * 1e3; });
      Row r{kSuite, lcase, "ms", "ms", p.ours, p.baseline, "masked_loop", Better::lower, extra};
      r.extra["what"] = "whole MoE layer (SwiGLU experts), forward and backward";
      emit(r);
    }
  }
}

}  // namespace

int run_kernels_suite(const BenchOptions& opt) {
  const int reps = opt.quick ? 5 : std::max(opt.reps, 9);
  moe_cases(opt, reps);
  for (const char* c : {"metadata_cache", "offload_double_vs_sync", "offload_double_vs_none", "offload_overlap_emulated",
                        "offload_memory", "all_vs_none"})
    if (opt.wants(c))
      std::fprintf(stderr, "troupe bench kernels: no row for %s: not implemented yet (needs the policy model's "
                   "training step)\n", c);
  return 0;
}

}  // namespace troupe::bench
