// envs.reward_model: a `type: reward_model` entry read into an EnvSpec (and written back), every bad
// key named; the dataset env it becomes (verifier none, no answer field, the prompt in the metadata);
// reward_weights combining the verifier, a judge and the score;
// the centering unit (none, batch, running, state round trip).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "troupe/envs/client.h"
#include "troupe/envs/registry.h"
#include "troupe/envs/reward_center.h"

using namespace troupe::envs;
using nlohmann::json;

namespace {

json entry(json config = json::object()) {
  return {{"name", "rm"}, {"type", "reward_model"}, {"path", "/models/rm"}, {"config", std::move(config)}};
}

std::string error_of(const json& j) {
  auto s = parse_env_spec(j, "x.yaml: envs[0]");
  return s.ok() ? std::string("(parsed)") : s.error().message;
}

TEST(RewardModelSpec, ReadsPathCenterAndTemplate) {
  auto s = parse_env_spec(entry({{"train", "rows.jsonl"}, {"center", "running"}, {"score_template", "plain"}}), "envs[0]");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->type, EnvType::builtin);
  EXPECT_EQ(s->env, "dataset");
  ASSERT_TRUE(s->reward_model.has_value());
  EXPECT_EQ(s->reward_model->path, "/models/rm");
  EXPECT_EQ(s->reward_model->center, RewardCenter::running);
  EXPECT_EQ(s->reward_model->score_template, ScoreTemplate::plain);
  // the dataset env sees neither key, a verifier default of none and the marker
  EXPECT_FALSE(s->config.contains("center"));
  EXPECT_FALSE(s->config.contains("score_template"));
  EXPECT_EQ(s->config["verifier"], "none");
  EXPECT_EQ(s->config[kScoredExternallyKey], true);
  // written back and read again: the same spec
  const json back = to_json(*s);
  EXPECT_EQ(back["type"], "reward_model");
  EXPECT_EQ(back["config"]["center"], "running");
  auto again = parse_env_spec(back, "envs[0]");
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->reward_model->center, RewardCenter::running);
  EXPECT_EQ(again->config, s->config);
  // defaults: chat, none; a named verifier stays
  auto d = parse_env_spec(entry({{"train", "rows.jsonl"}, {"verifier", "exact"}}), "envs[0]");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->reward_model->center, RewardCenter::none);
  EXPECT_EQ(d->reward_model->score_template, ScoreTemplate::chat);
  EXPECT_EQ(d->config["verifier"], "exact");
  // other envs have none
  auto plain = parse_env_spec({{"name", "arithmetic"}}, "envs[0]");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->reward_model.has_value());
}

TEST(RewardModelSpec, ErrorsNameTheKey) {
  json no_path = entry();
  no_path.erase("path");
  EXPECT_NE(error_of(no_path).find("x.yaml: envs[0]: a reward_model env needs 'path'"), std::string::npos) << error_of(no_path);
  const std::string center = error_of(entry({{"center", "median"}}));
  EXPECT_NE(center.find("config.center must be none, batch or running (got \"median\")"), std::string::npos) << center;
  const std::string tmpl = error_of(entry({{"score_template", 3}}));
  EXPECT_NE(tmpl.find("config.score_template must be chat or plain (got 3)"), std::string::npos) << tmpl;
  const std::string judge = error_of(entry({{"judge", {{"url", "http://x"}}}}));
  EXPECT_NE(judge.find("config.judge is not for a reward_model env"), std::string::npos) << judge;
  const std::string python = error_of(entry({{"verifier", "python"}}));
  EXPECT_NE(python.find("config.verifier python is not for a reward_model env"), std::string::npos) << python;
  json other = entry();
  other["env"] = "arithmetic";
  EXPECT_NE(error_of(other).find("'env' must be dataset or absent"), std::string::npos) << error_of(other);
  json bad_type = entry();
  bad_type["type"] = "reward";
  EXPECT_NE(error_of(bad_type).find("reward_model"), std::string::npos) << error_of(bad_type);
}

TEST(RewardModelSpec, DatasetEnvGivesThePromptAndNeedsNoAnswer) {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_rm_spec_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "rows.jsonl");
    f << R"({"question": "Say hi."})" << "\n" << R"({"question": "Say bye."})" << "\n";
  }
  auto s = parse_env_spec(entry({{"train", (dir / "rows.jsonl").string()}, {"eval_fraction", 0}}), "envs[0]");
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto env = EnvRegistry::global().create("dataset", s->config);
  ASSERT_TRUE(env.ok()) << env.error().message;
  auto obs = (*env)->reset(3, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  EXPECT_EQ(obs->metadata["prompt"], obs->text);
  auto v = (*env)->verify(obs->metadata, "hi");
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->reward, 0.0);  // the reward model's score replaces it
  // without the marker, verifier none still needs a judge
  json plain = s->config;
  plain.erase(kScoredExternallyKey);
  auto refused = EnvRegistry::global().create("dataset", plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("verifier: none needs 'judge'"), std::string::npos) << refused.error().message;
  std::filesystem::remove_all(dir);
}

// config.reward_weights on a reward_model env: the dataset env's reward is the weighted sum of its own
// components (the env worker adds reward_weights.reward_model x the score); a judge and a Python
// hook are allowed with it; the weights' names are checked against the env's components.
TEST(RewardModelSpec, RewardWeightsCombineTheSources) {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_rm_weights_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "rows.jsonl") << R"({"question": "1+1", "answer": "2"})" << "\n";
  const std::string rows = (dir / "rows.jsonl").string();
  auto s = parse_env_spec(entry({{"train", rows}, {"eval_fraction", 0}, {"verifier", "numeric"}, {"extract", "last_number"},
                                 {"reward_weights", {{"verifier", 2.0}, {"reward_model", 0.5}}}}),
                          "envs[0]");
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto again = parse_env_spec(to_json(*s), "envs[0]");
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->config, s->config);
  auto env = EnvRegistry::global().create("dataset", s->config);
  ASSERT_TRUE(env.ok()) << env.error().message;
  auto obs = (*env)->reset(0, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  auto v = (*env)->verify(obs->metadata, "it is 2");
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->reward, 2.0);  // 2 x verifier (1); the env worker adds 0.5 x the score
  EXPECT_EQ(v->components.at("verifier"), 1.0);
  EXPECT_EQ(v->components.at("correct"), 1.0);
  EXPECT_FALSE(v->components.count("reward_model"));
  // a judge and a Python hook are allowed with reward_weights, refused without
  EXPECT_TRUE(parse_env_spec(entry({{"judge", {{"url", "http://x"}, {"model", "m"}}}, {"reward_weights", {{"judge", 1}}}}),
                             "envs[0]")
                  .ok());
  EXPECT_NE(error_of(entry({{"judge", {{"url", "http://x"}}}})).find("without config.reward_weights"), std::string::npos);
  // bad weights named: not a number, no component of this env
  auto bad = parse_env_spec(entry({{"train", rows}, {"reward_weights", {{"reward_model", "x"}}}}), "envs[0]");
  ASSERT_TRUE(bad.ok());
  auto refused = EnvRegistry::global().create("dataset", bad->config);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("reward_weights.reward_model must be a number"), std::string::npos)
      << refused.error().message;
  auto unknown = parse_env_spec(entry({{"train", rows}, {"verifier", "exact"}, {"reward_weights", {{"judge", 1}}}}), "envs[0]");
  ASSERT_TRUE(unknown.ok());
  refused = EnvRegistry::global().create("dataset", unknown->config);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("reward_weights.judge names no reward component (this env's are: verifier, "
                                         "reward_model)"),
            std::string::npos)
      << refused.error().message;
  std::filesystem::remove_all(dir);
}

TEST(RewardCentering, NoneLeavesScores) {
  RewardCentering c(RewardCenter::none);
  std::vector<double> x = {1, 2, 3};
  const std::vector<char> ok = {1, 1, 1};
  EXPECT_EQ(c.apply(x, ok), 0.0);
  EXPECT_EQ(x, (std::vector<double>{1, 2, 3}));
}

TEST(RewardCentering, BatchSubtractsTheMeanOfValidScores) {
  RewardCentering c(RewardCenter::batch);
  std::vector<double> x = {1, 2, 100, 3};
  const std::vector<char> ok = {1, 1, 0, 1};  // the failed one is neither read nor changed
  EXPECT_EQ(c.apply(x, ok), 2.0);
  EXPECT_EQ(x, (std::vector<double>{-1, 0, 100, 1}));
  std::vector<double> y = {10, 20};
  EXPECT_EQ(c.apply(y, std::vector<char>{1, 1}), 15.0);  // no memory between batches
  EXPECT_EQ(c.count(), 0);
  std::vector<double> none = {5};
  EXPECT_EQ(c.apply(none, std::vector<char>{0}), 0.0);
  EXPECT_EQ(none[0], 5.0);
}

TEST(RewardCentering, RunningSubtractsTheMeanOfEveryScoreSoFar) {
  RewardCentering c(RewardCenter::running);
  std::vector<double> a = {1, 3};
  EXPECT_EQ(c.apply(a, std::vector<char>{1, 1}), 2.0);
  EXPECT_EQ(a, (std::vector<double>{-1, 1}));
  std::vector<double> b = {8, -50};
  EXPECT_EQ(c.apply(b, std::vector<char>{1, 0}), 4.0);  // mean of 1, 3, 8
  EXPECT_EQ(b, (std::vector<double>{4, -50}));
  EXPECT_EQ(c.count(), 3);
  // the state restores exactly, so a resumed run continues bit for bit
  RewardCentering resumed(RewardCenter::running);
  ASSERT_TRUE(resumed.restore(json::parse(c.state().dump())).ok());
  std::vector<double> p = {0.1, 0.7}, q = p;
  c.apply(p, std::vector<char>{1, 1});
  resumed.apply(q, std::vector<char>{1, 1});
  EXPECT_EQ(p, q);
  EXPECT_EQ(resumed.mean(), c.mean());
  auto bad = resumed.restore(json{{"count", -1}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'count'"), std::string::npos);
  auto bad2 = resumed.restore(json{{"count", 2}});
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.error().message.find("'mean_bits'"), std::string::npos);
}

}  // namespace
