// envs.judge_model: a dataset env's judge with `model: PATH` (no url) scored by the run's scorers:
// the env reaches a ScorerActor only by messages (envs::call_local_model, installed by
// actors::set_scorer_peers), through a silent-then-retried scorer, and fails with its reason
// (judge_http) naming the cause when no scorer is reachable. The judge model is the digit judge
// (digit_judge.h): its greedy verdict is the response's last digit, so it parses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "digit_judge.h"

#include "troupe/actors/roles.h"
#include "troupe/actors/scorer.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/client.h"
#include "troupe/envs/local_model.h"
#include "troupe/envs/trajectory.h"

using namespace troupe;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

class MuteScorer : public runtime::Actor {
 public:
  MuteScorer() {
    handle<actors::ScoreReq>([](runtime::Context&, const actors::ScoreReq&) -> Status { return {}; });
  }
};

TEST(JudgeModel, ScoresThroughTheScorers) {
  const fs::path root = fs::temp_directory_path() / ("troupe-judge-model-" + std::to_string(::getpid()));
  fs::create_directories(root);
  auto saved = test_fixtures::save_digit_judge((root / "judge").string());
  ASSERT_TRUE(saved.ok()) << saved.error().message;
  const std::string path = *saved;
  std::ofstream(root / "rows.jsonl") << R"({"question": "1+1", "answer": "2"})" "\n";
  const json config = {{"train", (root / "rows.jsonl").string()},
                       {"eval_fraction", 0.0},
                       {"verifier", "none"},
                       {"judge",
                        {{"model", path},
                         {"rubric", "Q: {prompt} Score: {response}"},
                         {"pattern", "([0-9])"},
                         {"range", {0, 10}},
                         {"max_tokens", 3},
                         {"timeout_s", 0.5}}}};
  auto env = envs::make_dataset_env(config);
  ASSERT_TRUE(env.ok()) << env.error().message;
  auto obs = (*env)->reset(0, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;

  // no scorer reachable: the judge call fails with its reason, naming why
  envs::set_local_model_caller({});
  auto none = (*env)->verify(obs->metadata, "2");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(envs::termination_name(envs::termination_for(none.error())), "judge_http") << none.error().message;
  EXPECT_NE(none.error().message.find("no scorer is reachable"), std::string::npos) << none.error().message;

  // scorer 0 never answers (its try runs into judge.timeout_s), scorer 1 serves the model
  auto scorer = actors::Scorer::create({path}, {});
  ASSERT_TRUE(scorer.ok()) << scorer.error().message;
  std::shared_ptr<actors::Scorer> sp = std::move(scorer).value();
  runtime::SystemConfig sc;
  sc.threads = 2;
  auto sys = runtime::ActorSystem::create(sc);
  ASSERT_TRUE(sys.ok());
  auto mute = (*sys)->spawn([]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<MuteScorer>(); });
  auto good = (*sys)->spawn([sp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<actors::ScorerActor>(sp, 1); });
  ASSERT_TRUE(mute.ok() && good.ok());
  actors::set_scorer_peers(**sys, {*mute, *good}, actors::ExperimentConfig{});
  auto v = (*env)->verify(obs->metadata, "2");
  ASSERT_TRUE(v.ok()) << v.error().message;
  const double j = v->components.at("judge");
  EXPECT_EQ(j, 0.2);  // the verdict "2..." parsed and mapped from range [0, 10]
  EXPECT_DOUBLE_EQ(v->reward, j);
  auto again = (*env)->verify(obs->metadata, "2");  // greedy: the same verdict
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->components.at("judge"), j);

  // an env worker's verify of a group: its reply carries what the judge's scorer requests cost
  // (the step rows' scorer/judge/*), its calls run off the runtime threads (concurrent)
  envs::EnvSpec spec;
  spec.name = spec.env = "dataset";
  spec.config = config;
  auto worker = actors::EnvWorker::create({spec});
  ASSERT_TRUE(worker.ok()) << worker.error().message;
  ASSERT_TRUE((*worker)->concurrent("dataset"));
  auto wobs = (*worker)->reset({"dataset", "e1", 0, 0});
  ASSERT_TRUE(wobs.ok()) << wobs.error().message;
  auto rep = (*worker)->verify({"dataset", wobs->metadata_json, {"2", "3", "4"}});
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  for (const auto& e : rep->errors) EXPECT_EQ(e, "");
  ASSERT_EQ(rep->rewards.size(), 3u);
  EXPECT_EQ(rep->rewards[0], 0.2);
  EXPECT_EQ(rep->rewards[1], 0.3);
  EXPECT_EQ(rep->rewards[2], 0.4);
  const auto& js = rep->judge_scorer;
  EXPECT_EQ(js.requests, 3);
  // calls start at the next scorer in turn (calls 2, 3, 4 of this caller: scorer 0, 1, 0), so two
  // first tried the silent scorer 0
  EXPECT_EQ(js.failures, 2);
  EXPECT_EQ(js.retries, 2);
  EXPECT_GT(js.latency_s, 0);
  EXPECT_GE(js.latency_max_s, js.latency_s / 3);  // the slowest >= the mean
  EXPECT_LE(js.latency_max_s, js.latency_s);
  EXPECT_GE(js.batch_requests, 3);  // each request shared its batch with at least itself
  EXPECT_GE(js.batch_requests_max, 1);
  EXPECT_LE(js.batch_requests_max, 3);
  EXPECT_EQ(rep->reward_model_scorer.requests, 0);
  envs::set_local_model_caller({});
  (*sys)->shutdown();
  fs::remove_all(root);
}

}  // namespace
