// AdamW against a hand-written double-precision reference, clipping by global norm, schedules.
#include "troupe/learner/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace troupe::learner;

TEST(AdamW, MatchesReferenceOverSeveralSteps) {
  OptimizerConfig c;
  c.lr = 0.01f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.weight_decay = 0.1f;
  std::vector<float> p{0.5f, -1.0f, 2.0f}, g(3);
  std::vector<double> rp{0.5, -1.0, 2.0}, rm(3, 0), rv(3, 0);
  AdamW opt(3);
  for (int t = 1; t <= 5; ++t) {
    for (int i = 0; i < 3; ++i) g[i] = static_cast<float>(std::sin(t + i));
    ASSERT_TRUE(opt.step(p, g, c, c.lr).ok());
    for (int i = 0; i < 3; ++i) {
      const double gi = g[i];
      rm[i] = 0.9 * rm[i] + 0.1 * gi;
      rv[i] = 0.95 * rv[i] + 0.05 * gi * gi;
      rp[i] *= 1 - 0.01 * 0.1;
      const double mh = rm[i] / (1 - std::pow(0.9, t)), vh = rv[i] / (1 - std::pow(0.95, t));
      rp[i] -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
      EXPECT_NEAR(p[i], rp[i], 1e-6);
    }
  }
  EXPECT_EQ(opt.steps(), 5);
  EXPECT_FALSE(opt.step(std::span<float>(p.data(), 2), g, c, 0.1).ok());
}

TEST(ClipGradNorm, ScalesToMaxNorm) {
  std::vector<float> g{3, 4};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 1.0), 5.0);
  EXPECT_NEAR(global_grad_norm(g), 1.0, 1e-6);
  std::vector<float> small{0.3f, 0.4f};
  clip_grad_norm(small, 1.0);
  EXPECT_FLOAT_EQ(small[0], 0.3f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 0), global_grad_norm(g));
}

TEST(Schedule, WarmupThenConstantOrCosine) {
  OptimizerConfig c;
  c.lr = 1.0f;
  c.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 100), 1.0);
  c.schedule = LrSchedule::cosine;
  c.total_steps = 14;
  c.min_lr_ratio = 0.1f;
  EXPECT_NEAR(learning_rate_at(c, 4), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate_at(c, 9), 0.1 + 0.9 * 0.5, 1e-7);
  EXPECT_NEAR(learning_rate_at(c, 14), 0.1, 1e-7);
  EXPECT_NEAR(learning_rate_at(c, 50), 0.1, 1e-7);
}
