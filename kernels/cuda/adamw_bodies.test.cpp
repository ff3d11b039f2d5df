// kernels.cuda_adamw_bodies: the device optimizer's bodies (bodies/adamw.h) run on the host grid
// against the CPU AdamW (learner/optimizer.cpp) and clip_grad_norm: parameters and both moments
// bit for bit over several steps, tensors of odd sizes cut into chunks, 1, 3 and 5 lanes, with and
// without clipping; the device's gradient norm within 1e-14 relative of the CPU's (a different
// summation order in double) and the same clipping coefficient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bodies/adamw.h"
#include "bodies/host_grid.h"
#include "troupe/kernels/random.h"
#include "troupe/learner/optimizer.h"

namespace troupe::kernels::cuda {
namespace {

struct Case {
  std::vector<size_t> sizes{1, 37, 300, 4097, 5};
  size_t chunk = 256;
  float max_grad_norm = 0.0f;
  float weight_decay = 0.01f;
  int lanes = 3;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void run_case(const Case& c) {
  size_t n = 0;
  for (size_t s : c.sizes) n += s;
  uint64_t rng = 12345;
  std::vector<float> p(n), g(n);
  for (auto& x : p) x = static_cast<float>(uniform01(rng) - 0.5);
  std::vector<float> cpu_p = p;
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  learner::AdamW cpu(n);
  learner::OptimizerConfig cfg;
  cfg.weight_decay = c.weight_decay;
  cfg.max_grad_norm = c.max_grad_norm;
  std::vector<AdamWTensor> tensors;
  size_t off = 0;
  for (size_t s : c.sizes) {
    tensors.push_back({p.data() + off, g.data() + off, m.data() + off, v.data() + off, s});
    off += s;
  }
  const std::vector<AdamWChunk> chunks = adamw_chunks(tensors, c.chunk);
  std::vector<double> partial(chunks.size());
  for (int step = 0; step < 4; ++step) {
    for (auto& x : g) x = static_cast<float>((uniform01(rng) - 0.5) * (step + 1));
    std::vector<float> cpu_g = g;
    const double lr = learner::learning_rate_at(cfg, step) * (1.0 + 0.25 * step);
    // the CPU: clip in place, then the step
    const double cpu_norm = learner::clip_grad_norm(cpu_g, cfg.max_grad_norm);
    ASSERT_TRUE(cpu.step(cpu_p, cpu_g, cfg, lr).ok());
    // the device bodies: sum of squares per chunk, the clip coefficient, the fused step
    host_for_rows(GradSumSqBody{tensors.data(), chunks.data(), partial.data()}, static_cast<int>(chunks.size()),
                  c.lanes);
    double norm = 0;
    float scale = 0;
    host_for_rows(ClipBody{partial.data(), static_cast<int>(chunks.size()), cfg.max_grad_norm, &norm, &scale}, 1,
                  c.lanes);
    EXPECT_NEAR(norm, cpu_norm, 1e-14 * cpu_norm) << "step " << step;
    const AdamWCoefficients k = adamw_coefficients(cfg.beta1, cfg.beta2, lr, cfg.weight_decay, cfg.eps, step + 1);
    host_for_rows(AdamWBody{tensors.data(), chunks.data(), k, &scale}, static_cast<int>(chunks.size()), c.lanes);
    ASSERT_TRUE(same_bits(p, cpu_p)) << "params, step " << step << ", lanes " << c.lanes;
    std::vector<float> cm(cpu.exp_avg().begin(), cpu.exp_avg().end()), cv(cpu.exp_avg_sq().begin(), cpu.exp_avg_sq().end());
    ASSERT_TRUE(same_bits(m, cm)) << "exp_avg, step " << step;
    ASSERT_TRUE(same_bits(v, cv)) << "exp_avg_sq, step " << step;
  }
}

TEST(CudaAdamWBodies, BitForBitTheCpuAdamW) {
  for (int lanes : {1, 5}) {
    Case c;
    c.lanes = lanes;
    run_case(c);
  }
}

TEST(CudaAdamWBodies, ClippingAsClipGradNorm) {
  Case c;
  c.max_grad_norm = 0.5f;  // the gradients' norm is ~ 20+: every step clips
  run_case(c);
  c.max_grad_norm = 1e6f;  // never clips (coefficient 1)
  c.chunk = 1000;
  run_case(c);
}

TEST(CudaAdamWBodies, ChunkTableCoversEveryElementOnce) {
  std::vector<AdamWTensor> t{{nullptr, nullptr, nullptr, nullptr, 0},
                             {nullptr, nullptr, nullptr, nullptr, 10},
                             {nullptr, nullptr, nullptr, nullptr, 4}};
  const auto ch = adamw_chunks(t, 4);
  ASSERT_EQ(ch.size(), 4u);  // 10 -> 4 + 4 + 2, 4 -> 4; the empty tensor gets none
  EXPECT_EQ(ch[0].tensor, 1);
  EXPECT_EQ(ch[2].begin, 8u);
  EXPECT_EQ(ch[2].end, 10u);
  EXPECT_EQ(ch[3].tensor, 2);
  EXPECT_EQ(ch[3].end, 4u);
}

}  // namespace
}  // namespace troupe::kernels::cuda
