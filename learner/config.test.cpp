// Option names as users write them (TRL / veRL spellings) and validation messages.
#include "troupe/learner/config.h"

#include <gtest/gtest.h>

using namespace troupe::learner;

TEST(LearnerConfig, ParsesUserNames) {
  EXPECT_EQ(*parse_loss_agg_mode("dapo"), LossAggMode::token_mean);
  EXPECT_EQ(*parse_loss_agg_mode("grpo"), LossAggMode::seq_mean_token_mean);
  EXPECT_EQ(*parse_loss_agg_mode("dr_grpo"), LossAggMode::seq_mean_token_sum_norm);
  EXPECT_EQ(*parse_loss_agg_mode("seq-mean-token-sum"), LossAggMode::seq_mean_token_sum);
  EXPECT_EQ(*parse_kl_estimator("low_var_kl"), KlEstimator::k3);
  EXPECT_EQ(*parse_kl_estimator("mse"), KlEstimator::k2);
  EXPECT_EQ(*parse_kl_estimator("kl"), KlEstimator::k1);
  EXPECT_EQ(*parse_std_mode("false"), StdMode::none);
  EXPECT_EQ(*parse_std_mode("batch"), StdMode::batch);
  EXPECT_EQ(*parse_advantage_estimator("rloo"), AdvantageEstimator::rloo);
  EXPECT_EQ(*parse_advantage_estimator("reinforce_pp"), AdvantageEstimator::reinforce_pp);
  EXPECT_EQ(*parse_importance_sampling_level("sequence"), ImportanceSamplingLevel::sequence);
  EXPECT_EQ(*parse_lr_schedule("cosine"), LrSchedule::cosine);
  auto bad = parse_kl_estimator("k4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'k4'"), std::string::npos);
  EXPECT_NE(bad.error().message.find("low_var_kl"), std::string::npos);
  for (auto m : {LossAggMode::token_mean, LossAggMode::seq_mean_token_mean, LossAggMode::seq_mean_token_sum,
                 LossAggMode::seq_mean_token_sum_norm})
    EXPECT_EQ(*parse_loss_agg_mode(to_string(m)), m);
}

TEST(LearnerConfig, ValidateNamesTheField) {
  EXPECT_TRUE(validate(LearnerConfig{}).ok());
  auto expect_bad = [](LearnerConfig c, const char* field) {
    auto s = validate(c);
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_NE(s.error().message.find(field), std::string::npos) << s.error().message;
    EXPECT_EQ(s.error().code, troupe::ErrorCode::invalid_input);
  };
  LearnerConfig c;
  c.loss.epsilon = 1.5f;
  expect_bad(c, "epsilon");
  c = {};
  c.loss.clip_ratio_c = 0.5f;
  expect_bad(c, "clip_ratio_c");
  c = {};
  c.optimizer.lr_scheduler_type = LrSchedule::cosine;
  expect_bad(c, "total_steps");
  c = {};
  c.batch.num_iterations = 0;
  expect_bad(c, "num_iterations");
  c = {};
  c.batch.temperature = 0;
  expect_bad(c, "temperature");
  c = {};
  c.loss.beta = -1;
  expect_bad(c, "beta");
}
