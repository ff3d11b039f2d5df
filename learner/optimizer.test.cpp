// AdamW against a hand-written double-precision reference, the same values on 1 and 2 threads and
// with a StepObserver (which sees every block once, in order, after it is written), clipping by
// global norm, schedules.
#include "troupe/learner/optimizer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <mutex>

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

namespace {

// Hands the step three ranges out of order (the middle one starts past a block boundary) and
// records, per range, the blocks it was shown with a copy of their values at that moment.
struct RecordingObserver : StepObserver {
  std::vector<std::pair<size_t, size_t>> ranges;
  std::vector<std::vector<std::pair<size_t, size_t>>> seen;
  std::vector<float> values_when_seen;
  std::mutex mu;
  int steps_begun = 0, steps_ended = 0;
  std::span<const std::pair<size_t, size_t>> begin_step(size_t n) override {
    ranges = {{5000, n}, {0, 4100}, {4100, 5000}};
    seen.assign(ranges.size(), {});
    values_when_seen.assign(n, 0.0f);
    ++steps_begun;
    return ranges;
  }
  void updated(size_t range, size_t begin, size_t end, const float* params) override {
    std::lock_guard lk(mu);
    seen[range].emplace_back(begin, end);
    std::memcpy(values_when_seen.data() + begin, params + begin, (end - begin) * sizeof(float));
  }
  void end_step() override { ++steps_ended; }
};

}  // namespace

// The update is elementwise: one thread, two threads and a watched step give the same bits, and
// the observer sees each range front to back in blocks that tile it, each with its final values.
TEST(AdamW, ThreadsAndObserverDoNotChangeTheValues) {
  const size_t n = 20000;
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.weight_decay = 0.01f;
  std::vector<float> p0(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p0[i] = std::sin(0.37f * static_cast<float>(i));
    g[i] = std::cos(0.11f * static_cast<float>(i));
  }
  auto run = [&](int threads, StepObserver* watch) {
    std::vector<float> p = p0;
    AdamW opt(n);
    omp_set_num_threads(threads);
    for (int t = 0; t < 3; ++t) EXPECT_TRUE(opt.step(p, g, c, c.lr, watch).ok());
    return p;
  };
  const auto one = run(1, nullptr), two = run(2, nullptr);
  RecordingObserver watch;
  const auto watched = run(2, &watch);
  EXPECT_EQ(std::memcmp(one.data(), two.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(one.data(), watched.data(), n * sizeof(float)), 0);
  EXPECT_EQ(watch.steps_begun, 3);
  EXPECT_EQ(watch.steps_ended, 3);
  for (size_t r = 0; r < watch.ranges.size(); ++r) {
    size_t at = watch.ranges[r].first;
    for (auto [b, e] : watch.seen[r]) {
      EXPECT_EQ(b, at) << "range " << r;
      EXPECT_LT(b, e);
      at = e;
    }
    EXPECT_EQ(at, watch.ranges[r].second) << "range " << r;
  }
  EXPECT_EQ(std::memcmp(watch.values_when_seen.data(), watched.data(), n * sizeof(float)), 0);
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
