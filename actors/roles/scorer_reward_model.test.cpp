// actors.scorer_reward_model: a reward model on the scorer (ScoreReq sequence_score): the transformers
// fixture's scores (tests/reward_model/), the same bits as the model scored in-process, one batch of
// several requests == each alone, and the kinds a score-head model refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "troupe/actors/scorer.h"
#include "troupe/policy/io/reward_model_dir.h"

namespace troupe::actors {
namespace {

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("TROUPE_REWARD_FIXTURES");
  return (std::filesystem::path(dir ? dir : "tests/reward_model") / name).string();
}

TEST(ScorerRewardModel, ScoresLikeTransformersAndInProcess) {
  const std::string path = fixture("llama");
  auto s = Scorer::create({path}, policy::ExecutionOptions{});
  ASSERT_TRUE(s.ok()) << s.error().message;
  std::ifstream in(path + "/expected.json");
  const auto expected = nlohmann::json::parse(in);
  ScoreReq a, b;
  a.kind = b.kind = static_cast<int32_t>(ScoreKind::sequence_score);
  a.model = b.model = path;
  std::vector<float> want;
  for (const auto& c : expected["cases"]) {
    a.sequences.push_back(c["tokens"].get<std::vector<int32_t>>());
    want.push_back(c["scores"][0].get<float>());
  }
  for (const auto& r : expected["raw"]) b.sequences.push_back(r["tokens"].get<std::vector<int32_t>>());
  auto both = (*s)->run_batch({&a, &b});  // one packed forward for both requests
  ASSERT_TRUE(both[0].ok()) << both[0].error().message;
  ASSERT_TRUE(both[1].ok()) << both[1].error().message;
  ASSERT_EQ(both[0]->scores.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(both[0]->scores[i], want[i], 1e-5 + 1e-6 * std::fabs(want[i]));
  EXPECT_EQ(both[1]->scores.size(), expected["raw"].size());
  EXPECT_FALSE(both[0]->model_hash.empty());
  // alone == in a batch, and == the model loaded in this process the way an env worker loads it
  auto alone = (*s)->run(a);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->scores, both[0]->scores);
  policy::ExecutionOptions exec;
  exec.batch_invariant = true;
  auto rm = policy::io::load_reward_model(path, exec);
  ASSERT_TRUE(rm.ok()) << rm.error().message;
  auto local = policy::score_sequences(rm->model, rm->head, a.sequences);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(*local, alone->scores);
}

TEST(ScorerRewardModel, RefusesOtherKindsAndBadSequences) {
  auto s = Scorer::create({fixture("llama")}, policy::ExecutionOptions{});
  ASSERT_TRUE(s.ok()) << s.error().message;
  ScoreReq lp;
  lp.kind = static_cast<int32_t>(ScoreKind::logprobs);
  lp.model = fixture("llama");
  lp.sequences = {{1, 2, 3}};
  lp.starts = {1};
  auto r = (*s)->run(lp);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("sequence-classification model: it answers sequence_score requests only"),
            std::string::npos) << r.error().message;
  ScoreReq bad;
  bad.kind = static_cast<int32_t>(ScoreKind::sequence_score);
  bad.model = fixture("llama");
  bad.sequences = {{1, 2}, {}};
  auto e = (*s)->run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("sequence 1 is empty"), std::string::npos) << e.error().message;
  bad.sequences = {{1, 9999}};
  e = (*s)->run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("token 9999, outside the vocabulary"), std::string::npos) << e.error().message;
}

TEST(ScorerRewardModel, RewardModelEnvPathsAreServed) {
  ExperimentConfig c;
  EnvSpec e;
  e.name = "rm";
  e.type = EnvType::reward_model;
  e.path = "/models/rm";
  c.envs.push_back(e);
  const auto paths = scorer_model_paths(c);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0], "/models/rm");
}

}  // namespace
}  // namespace troupe::actors
