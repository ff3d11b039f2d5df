// troupe_gpu_bench: the cuda_* benchmark rows tests/gpu/run_all.sh prints, in the bench JSON-line
// format (docs/architecture.md: ratio > 1 means ours is better; medians of 5 interleaved
// repetitions). Each row is one optimization on vs off on the GPU, or the GPU against the CPU
// backend on the same op: chunked vs whole-vocabulary LM head + log-softmax (time and peak bytes
// of logits), the fp32 cuBLAS GEMM and packed attention vs the CPU backend, and the MoE experts'
// GEMMs grouped vs on side streams vs one per expert (expert_gemm.h). Exits 77 without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/chunked_logprob.h"
#include "troupe/kernels/device.h"
#include "troupe/kernels/expert_gemm.h"
#include "troupe/kernels/moe.h"

namespace k = troupe::kernels;

namespace {

double time_once(const k::Backend& be, const std::function<void()>& f) {
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  be.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median seconds of ours and the baseline, 5 interleaved repetitions after one warm-up each.
std::pair<double, double> interleaved(const k::Backend& a, const std::function<void()>& ours, const k::Backend& b,
                                      const std::function<void()>& base) {
  time_once(a, ours), time_once(b, base);
  std::vector<double> x, y;
  for (int r = 0; r < 5; ++r) x.push_back(time_once(a, ours)), y.push_back(time_once(b, base));
  std::sort(x.begin(), x.end()), std::sort(y.begin(), y.end());
  return {x[2], y[2]};
}

void row(const char* name, const char* metric, double ours, const char* baseline_name, double base,
         const std::string& extra) {
  std::printf("{\"suite\":\"kernels\",\"case\":\"%s\",\"metric\":\"%s\",\"unit\":\"s\",\"ours\":%.6g,"
              "\"baseline\":%.6g,\"baseline_name\":\"%s\",\"ratio\":%.4g%s}\n",
              name, metric, ours, base, baseline_name, ours > 0 ? base / ours : 0.0, extra.c_str());
}

k::Buffer buf(const k::Backend& be, size_t floats) {
  auto r = be.alloc(sizeof(float) * floats);
  if (!r.ok()) throw std::runtime_error(r.error().message);
  return std::move(r.value());
}

// x ~ N(0, 1) and w ~ N(0, 0.03^2) from one seeded host RNG: the same values on every backend.
void fill_seeded(const k::Backend& be, k::Buffer& x, k::Buffer& w, uint64_t seed) {
  uint64_t rng = seed;
  be.fill_normal(x.floats(), x.num_floats(), 1.0, &rng);
  be.fill_normal(w.floats(), w.num_floats(), 0.03, &rng);
}

}  // namespace

int main() {
  const k::CudaProbe probe = k::cuda_probe();
  if (!probe.error.empty()) {
    std::fprintf(stderr, "troupe_gpu_bench: CUDA could not start on this machine's GPU: %s\n",
                 probe.error.c_str());
    return 1;
  }
  if (probe.devices == 0) {
    std::fprintf(stderr, "troupe_gpu_bench: no CUDA device: no cuda_* rows\n");
    return 77;
  }
  auto gr = k::backend_for("cuda");
  if (!gr.ok()) {
    std::fprintf(stderr, "%s\n", gr.error().message.c_str());
    return 1;
  }
  const k::Backend& g = **gr;
  const k::Backend& c = k::cpu_backend();
  {  // chunked LM head + log-softmax: on (chunk 4096) vs off (whole vocabulary), on the GPU
    const int N = 2048, C = 1024, V = 49152, chunk = 4096;
    k::Buffer h = buf(g, size_t(N) * C), W = buf(g, size_t(V) * C), lp = buf(g, N), ent = buf(g, N), lse = buf(g, N),
              tg = buf(g, N), s_on = buf(g, k::chunked_logprob_scratch_floats(N, V, chunk)),
              s_off = buf(g, k::chunked_logprob_scratch_floats(N, V, 0));
    uint64_t rng = 1;
    g.fill_normal(h.floats(), h.num_floats(), 1.0, &rng);
    g.fill_normal(W.floats(), W.num_floats(), 0.02, &rng);
    const int32_t* t = static_cast<const int32_t*>(tg.data());  // zeros: token 0
    auto run = [&](int ch, k::Buffer& s) {
      return [&, ch] {
        g.chunked_logprob_forward(lp.floats(), ent.floats(), lse.floats(), h.floats(), W.floats(), t, 1.0f, N, C, V,
                                  ch, s.floats());
      };
    };
    const auto [on, off] = interleaved(g, run(chunk, s_on), g, run(0, s_off));
    row("cuda_chunked_logprob", "forward_time", on, "whole-vocabulary logits (cuda)", off,
        ",\"N\":2048,\"C\":1024,\"V\":49152,\"chunk\":4096,\"logits_bytes_ours\":" +
            std::to_string(s_on.bytes()) + ",\"logits_bytes_baseline\":" + std::to_string(s_off.bytes()));
  }
  {  // GEMM: cuBLAS fp32 vs the CPU backend
    const int N = 1024, C = 1024, OC = 1024;
    k::Buffer gx = buf(g, size_t(N) * C), gw = buf(g, size_t(OC) * C), go = buf(g, size_t(N) * OC);
    k::Buffer cx = buf(c, size_t(N) * C), cw = buf(c, size_t(OC) * C), co = buf(c, size_t(N) * OC);
    // Seeded normal inputs, the same on both backends: zeros would let either side's GEMM (or a
    // BLAS that skips zero blocks) run a case no model produces.
    fill_seeded(g, gx, gw, 11), fill_seeded(c, cx, cw, 11);
    const auto [ours, base] = interleaved(
        g, [&] { g.matmul_forward(go.floats(), gx.floats(), gw.floats(), N, C, OC); }, c,
        [&] { c.matmul_forward(co.floats(), cx.floats(), cw.floats(), N, C, OC); });
    row("cuda_matmul_forward", "time", ours, "cpu backend", base, ",\"N\":1024,\"C\":1024,\"OC\":1024");
  }
  {  // packed causal attention forward + backward vs the CPU backend
    const int S = 8, L = 256, N = S * L, NH = 8, NKV = 2, HD = 64;
    std::vector<int32_t> cu(S + 1);
    for (int s = 0; s <= S; ++s) cu[size_t(s)] = s * L;
    auto make = [&](const k::Backend& be, std::vector<k::Buffer>& b, k::Buffer& cub) {
      for (size_t n : {size_t(N) * NH * HD, size_t(N) * NKV * HD, size_t(N) * NKV * HD, size_t(N) * NH * HD,
                       size_t(N) * NH, size_t(N) * NH * HD, size_t(N) * NH * HD, size_t(N) * NKV * HD,
                       size_t(N) * NKV * HD, be.attention_scratch_floats(L)})
        b.push_back(buf(be, n));
      cub = buf(be, S + 1);
      be.copy_host_to_device(cub.data(), cu.data(), sizeof(int32_t) * cu.size());
      uint64_t rng = 3;
      for (int i = 0; i < 3; ++i) be.fill_normal(b[size_t(i)].floats(), b[size_t(i)].num_floats(), 1.0, &rng);
    };
    std::vector<k::Buffer> gb, cb;
    k::Buffer gcu, ccu;
    make(g, gb, gcu), make(c, cb, ccu);
    auto step = [&](const k::Backend& be, std::vector<k::Buffer>& b, k::Buffer& cub) {
      return [&] {
        const int32_t* cs = static_cast<const int32_t*>(cub.data());
        be.attention_forward(b[3].floats(), b[4].floats(), b[9].floats(), b[9].num_floats(), b[0].floats(),
                             b[1].floats(), b[2].floats(), cs, S, L, N, NH, NKV, HD);
        be.attention_backward(b[6].floats(), b[7].floats(), b[8].floats(), b[9].floats(), b[9].num_floats(),
                              b[5].floats(), b[0].floats(), b[1].floats(), b[2].floats(), b[3].floats(),
                              b[4].floats(), cs, S, L, N, NH, NKV, HD);
      };
    };
    const auto [ours, base] = interleaved(g, step(g, gb, gcu), c, step(c, cb, ccu));
    row("cuda_attention_fwd_bwd", "time", ours, "cpu backend", base, ",\"S\":8,\"L\":256,\"NH\":8,\"NKV\":2,\"HD\":64");
  }
  // MoE layer forward + backward: the experts' GEMMs as one grouped-batched call per phase vs on
  // side streams vs one per expert (the shapes of troupe bench kernels' cuda_moe_grouped_vs_* rows).
  for (const auto& [shape, E, N, C, H] : {std::tuple{"e8", 8, 8192, 128, 128}, std::tuple{"e64", 64, 8192, 128, 128},
                                          std::tuple{"e64_wide", 64, 2048, 1024, 512}}) {
    k::MoeConfig cfg;
    cfg.C = C, cfg.H = H, cfg.E = E, cfg.K = 2;
    const size_t EHC = size_t(E) * H * C;
    k::Buffer x = buf(g, size_t(N) * C), wr = buf(g, size_t(E) * C), wg = buf(g, EHC), wu = buf(g, EHC),
              wd = buf(g, EHC), out = buf(g, size_t(N) * C), dout = buf(g, size_t(N) * C), dx = buf(g, size_t(N) * C),
              dwr = buf(g, size_t(E) * C), dwg = buf(g, EHC), dwu = buf(g, EHC), dwd = buf(g, EHC),
              saved = buf(g, g.moe_saved_floats(cfg, N)), scratch = buf(g, g.moe_scratch_floats(cfg, N));
    uint64_t rng = 5;
    g.fill_normal(x.floats(), x.num_floats(), 1.0, &rng);
    g.fill_normal(dout.floats(), dout.num_floats(), 1.0, &rng);
    for (k::Buffer* b : {&wr, &wg, &wu, &wd}) g.fill_normal(b->floats(), b->num_floats(), 0.06, &rng);
    const k::MoeWeights w{wr.floats(), wg.floats(), wu.floats(), wd.floats(), nullptr, nullptr, nullptr, {}};
    const k::MoeGrads gr{dwr.floats(), dwg.floats(), dwu.floats(), dwd.floats(), nullptr, nullptr, nullptr, {}};
    auto layer = [&](k::ExpertGemm mode) {
      return [&, mode] {
        k::set_expert_gemm(mode);
        g.moe_forward(out.floats(), saved.floats(), nullptr, x.floats(), w, cfg, N, scratch.floats(), nullptr);
        g.moe_backward(dx.floats(), gr, dout.floats(), 0.0f, x.floats(), saved.floats(), w, cfg, N, scratch.floats());
      };
    };
    const std::string extra = ",\"experts\":" + std::to_string(E) + ",\"tokens\":" + std::to_string(N) +
                              ",\"d_model\":" + std::to_string(C) + ",\"expert_hidden\":" + std::to_string(H);
    for (k::ExpertGemm base : {k::ExpertGemm::streams, k::ExpertGemm::per_expert}) {
      const auto [ours, b] = interleaved(g, layer(k::ExpertGemm::grouped), g, layer(base));
      const std::string name = std::string("cuda_moe_grouped_vs_") + std::string(k::expert_gemm_name(base)) + "_" +
                               shape;
      row(name.c_str(), "time", ours, std::string(k::expert_gemm_name(base)).c_str(), b, extra);
    }
    k::set_expert_gemm(k::ExpertGemm::grouped);
  }
  return 0;
}
