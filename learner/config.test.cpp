// LearnerConfig validation: the defaults pass, every bad value is named in the message.
#include "troupe/learner/config.h"

#include <gtest/gtest.h>

using namespace troupe::learner;

TEST(LearnerConfig, ValidateNamesTheField) {
  EXPECT_TRUE(validate(LearnerConfig{}).ok());
  auto expect_bad = [](LearnerConfig c, const char* field) {
    auto s = validate(c);
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_NE(s.error().message.find(field), std::string::npos) << s.error().message;
    EXPECT_EQ(s.error().code, troupe::ErrorCode::invalid_input);
  };
  LearnerConfig c;
  c.loss.clip_low = 1.5f;
  expect_bad(c, "clip_low");
  c = {};
  c.loss.dual_clip = 0.5f;
  expect_bad(c, "dual_clip");
  c = {};
  c.loss.two_sided_clip = 1.1f;
  expect_bad(c, "two_sided_clip");
  c = {};
  c.optimizer.schedule = LrSchedule::cosine;
  expect_bad(c, "total_steps");
  c = {};
  c.batch.num_iterations = 0;
  expect_bad(c, "num_iterations");
  c = {};
  c.batch.temperature = 0;
  expect_bad(c, "temperature");
  c = {};
  c.loss.kl_coef = -1;
  expect_bad(c, "kl_coef");
  c = {};
  c.optimizer.eps = 0;
  expect_bad(c, "eps");
  c = {};
  c.expert_parallel = 0;
  expect_bad(c, "policy.moe.expert_parallel must be >= 1, got 0");
  c = {};
  c.expert_parallel = 2;
  EXPECT_TRUE(validate(c).ok());
  c.shard = ShardStage::gradients;
  EXPECT_TRUE(validate(c).ok());
  c.shard = ShardStage::parameters;
  EXPECT_TRUE(validate(c).ok());
  c = {};
  c.expert_parallel = 2;
  c.distill.teacher.push_back('t');  // (not = "t": GCC 12 warns -Wrestrict on that assignment)
  c.distill.topk = 4;
  EXPECT_TRUE(validate(c).ok());  // (distillation's passes run with the exchange)
}
