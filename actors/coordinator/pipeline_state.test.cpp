// actors.pipeline_state: the async pipeline's part of a checkpoint (pipeline.bin) round trips bit
// for bit, each finished group's verify infos and scorer requests included (format 3: a resumed run
// logs scorer/judge/*, scorer/reward_model/* and judge/latency_s as an uninterrupted one does);
// format 2 (before them) still reads, without them; other formats and trailing bytes are refused.
#include "coordinator/pipeline_state.h"

#include <gtest/gtest.h>

namespace troupe::actors::coord {
namespace {

PipelineState saved(int32_t format) {
  PipelineState p;
  p.format = format;
  p.max_staleness = 1;
  p.trained_steps = 2;
  p.trained_episodes = 16;
  Rollout r;
  Rollout::Group g;
  g.index = 3;
  g.env = "sums";
  g.metadata = {{"prompt", "1+2="}};
  g.samples.resize(2);
  g.samples[0].tokens = {5, 6, 2};
  g.rewards = {0.7, 0.2};
  g.correct = {0, 0};
  g.errors = {"", ""};
  g.reasons = {"", ""};
  g.components = {R"({"judge":0.7})", R"({"judge":0.2})"};
  g.infos = {R"({"judge_latency_s":0.25})", R"({"judge_latency_s":0.5})"};
  g.judge_scorer.answered(0.25, 3);
  g.judge_scorer.answered(0.5, 1);
  g.judge_scorer.failures = 1;
  g.reward_model_scorer.answered(0.125, 2);
  r.groups.push_back(g);
  p.finished.emplace_back(2, r);
  return p;
}

TEST(PipelineState, KeepsEachGroupsVerifyInfosAndScorerRequests) {
  const PipelineState p = saved(3);
  auto back = decode_pipeline(encode_pipeline(p), "pipeline.bin");
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ(back->finished.size(), 1u);
  const auto& g = back->finished[0].second.groups.at(0);
  const auto& want = p.finished[0].second.groups[0];
  EXPECT_EQ(g.infos, want.infos);
  EXPECT_EQ(g.components, want.components);
  EXPECT_EQ(g.rewards, want.rewards);
  for (const auto* pair : {&g.judge_scorer, &g.reward_model_scorer}) {
    const auto& w = pair == &g.judge_scorer ? want.judge_scorer : want.reward_model_scorer;
    EXPECT_EQ(pair->requests, w.requests);
    EXPECT_EQ(pair->failures, w.failures);
    EXPECT_EQ(pair->latency_s, w.latency_s);
    EXPECT_EQ(pair->latency_max_s, w.latency_max_s);
    EXPECT_EQ(pair->batch_requests, w.batch_requests);
    EXPECT_EQ(pair->batch_requests_max, w.batch_requests_max);
  }
  EXPECT_EQ(encode_pipeline(*back), encode_pipeline(p));  // bit for bit
}

TEST(PipelineState, ReadsFormat2WithoutThemAndRefusesOthers) {
  auto old = decode_pipeline(encode_pipeline(saved(2)), "pipeline.bin");
  ASSERT_TRUE(old.ok()) << old.error().message;
  const auto& g = old->finished.at(0).second.groups.at(0);
  EXPECT_EQ(g.rewards, (std::vector<double>{0.7, 0.2}));
  EXPECT_TRUE(g.infos.empty());
  EXPECT_EQ(g.judge_scorer.requests, 0);
  auto bad = decode_pipeline(encode_pipeline(saved(4)), "ckpt/pipeline.bin");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("ckpt/pipeline.bin: format 4 (this troupe reads 2 and 3"), std::string::npos)
      << bad.error().message;
  auto trailing = decode_pipeline(encode_pipeline(saved(3)) + "x", "pipeline.bin");
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.error().message.find("1 trailing bytes"), std::string::npos) << trailing.error().message;
}

}  // namespace
}  // namespace troupe::actors::coord
