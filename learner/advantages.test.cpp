// Hand-computed group-advantage cases: G = 1, all-equal groups, NaN rewards, each std mode, RLOO,
// REINFORCE++, reward scaling/clipping, DAPO filtering and the soft overlong punishment.
#include "troupe/learner/advantages.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace troupe::learner;

namespace {
std::vector<float> adv_of(std::vector<float> r, int G, AdvantageConfig c = {}) {
  auto a = compute_advantages(r, G, c);
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.error().message);
  return a.ok() ? a.value() : std::vector<float>{};
}
}  // namespace

TEST(Advantages, GroupStdUnbiasedPlusEps) {
  // mean 0.25, unbiased std sqrt((0.75^2 + 3*0.25^2)/3) = 0.5
  auto a = adv_of({1, 0, 0, 0}, 4);
  EXPECT_NEAR(a[0], 0.75 / (0.5 + 1e-4), 1e-6);
  EXPECT_NEAR(a[1], -0.25 / (0.5 + 1e-4), 1e-6);
  AdvantageConfig c;
  c.std_eps = 1e-6f;
  EXPECT_NEAR(adv_of({1, 0, 0, 0}, 4, c)[0], 0.75 / (0.5 + 1e-6), 1e-6);
}

TEST(Advantages, NoStdIsDrGrpo) {
  AdvantageConfig c;
  c.scale_rewards = StdMode::none;
  auto a = adv_of({1, 0, 0, 0}, 4, c);
  EXPECT_FLOAT_EQ(a[0], 0.75f);
  EXPECT_FLOAT_EQ(a[3], -0.25f);
}

TEST(Advantages, BatchStdKeepsGroupMean) {
  // values 1,0,1,1: batch mean 0.75, unbiased var 0.25 -> std 0.5; group 2 is all equal -> 0
  AdvantageConfig c;
  c.scale_rewards = StdMode::batch;
  auto a = adv_of({1, 0, 1, 1}, 2, c);
  EXPECT_NEAR(a[0], 0.5 / 0.5001, 1e-6);
  EXPECT_NEAR(a[1], -0.5 / 0.5001, 1e-6);
  EXPECT_EQ(a[2], 0.0f);
  EXPECT_EQ(a[3], 0.0f);
}

TEST(Advantages, AllEqualAndSingletonGroupsAreZeroAndFinite) {
  for (auto mode : {StdMode::group, StdMode::batch, StdMode::none}) {
    AdvantageConfig c;
    c.scale_rewards = mode;
    c.std_eps = 0;  // even without eps: no division by a zero std
    for (float x : adv_of({3, 3, 3, -1, -1, -1}, 3, c)) EXPECT_EQ(x, 0.0f);
    for (float x : adv_of({0.5f, 2.0f, -7.0f}, 1, c)) EXPECT_EQ(x, 0.0f);
  }
  AdvantageConfig rloo;
  rloo.adv_estimator = AdvantageEstimator::rloo;
  for (float x : adv_of({1, 2, 3}, 1, rloo)) EXPECT_EQ(x, 0.0f);
}

TEST(Advantages, NanRewardIsMissing) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  AdvantageConfig c;
  c.scale_rewards = StdMode::none;
  auto a = adv_of({1, nan, 0}, 3, c);  // mean over {1, 0} = 0.5
  EXPECT_FLOAT_EQ(a[0], 0.5f);
  EXPECT_EQ(a[1], 0.0f);
  EXPECT_FLOAT_EQ(a[2], -0.5f);
  for (float x : adv_of({nan, nan, 1}, 3)) EXPECT_EQ(x, 0.0f);
}

TEST(Advantages, Rloo) {
  AdvantageConfig c;
  c.adv_estimator = AdvantageEstimator::rloo;
  auto a = adv_of({1, 0, 0, 0}, 4, c);
  EXPECT_NEAR(a[0], 1.0, 1e-6);
  EXPECT_NEAR(a[1], -1.0 / 3.0, 1e-6);
}

TEST(Advantages, ReinforcePlusPlusWhitensTheBatch) {
  AdvantageConfig c;
  c.adv_estimator = AdvantageEstimator::reinforce_pp;
  c.std_eps = 0;
  auto a = adv_of({1, 0, 0, 0, 2, 0.5f, 1, 1}, 4, c);
  double mean = 0, ss = 0;
  for (float x : a) mean += x;
  mean /= a.size();
  for (float x : a) ss += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 0.0, 1e-6);
  EXPECT_NEAR(std::sqrt(ss / (a.size() - 1)), 1.0, 1e-5);
}

TEST(Advantages, ScaleAndClip) {
  AdvantageConfig c;
  c.scale_rewards = StdMode::none;
  c.reward_scale = 2.0f;
  c.reward_clip = 1.5f;
  auto a = adv_of({1, 0}, 2, c);  // 2 -> 1.5 clipped, 0; mean 0.75
  EXPECT_FLOAT_EQ(a[0], 0.75f);
  EXPECT_FLOAT_EQ(a[1], -0.75f);
}

TEST(Advantages, BadSizesAreErrors) {
  auto a = compute_advantages(std::vector<float>{1, 2, 3}, 2, AdvantageConfig{});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("multiple of group_size"), std::string::npos);
  EXPECT_FALSE(compute_advantages(std::vector<float>{1}, 0, AdvantageConfig{}).ok());
  EXPECT_FALSE(compute_advantages(std::vector<float>{1, INFINITY}, 2, AdvantageConfig{}).ok());
}

TEST(Advantages, DapoFilterCountsGroupsWithSignal) {
  std::vector<char> keep;
  EXPECT_EQ(dapo_filter_groups(keep, std::vector<float>{1, 1, 0, 1, 0, 0, 1, 0}, 2), 2);
  EXPECT_EQ(keep, (std::vector<char>{0, 1, 0, 1}));
}

TEST(Advantages, SoftOverlongPunishment) {
  EXPECT_EQ(overlong_penalty(6, 10, 4, 1.0f), 0.0f);
  EXPECT_FLOAT_EQ(overlong_penalty(8, 10, 4, 1.0f), -0.5f);
  EXPECT_FLOAT_EQ(overlong_penalty(10, 10, 4, 2.0f), -2.0f);
  EXPECT_FLOAT_EQ(overlong_penalty(11, 10, 4, 1.0f), -1.0f);
  EXPECT_EQ(overlong_penalty(100, 10, 0, 1.0f), 0.0f);
}
