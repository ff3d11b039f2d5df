// envs.judge_model: a dataset env's judge with `model: PATH` (no url) scored by the run's scorers:
// the env reaches a ScorerActor only by messages (envs::call_local_model, installed by
// actors::set_scorer_peers), through a silent-then-retried scorer, and fails with its reason
// (judge_http) naming the cause when no scorer is reachable. The judge model is a tiny model whose
// head can only say 7 or 8, so its greedy verdict parses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "troupe/actors/roles.h"
#include "troupe/actors/scorer.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/client.h"
#include "troupe/envs/local_model.h"
#include "troupe/envs/trajectory.h"
#include "troupe/policy/io/model_io.h"

using namespace troupe;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A one-layer dense model with the char tokenizer whose logits are 0 except '7' (+50 h0) and
// '8' (-50 h0), h0 the first feature after the final norm: every token it says is a 7 or an 8.
std::string save_judge_model(const fs::path& dir) {
  actors::ExperimentConfig c;
  auto& m = c.policy.model;
  m.vocab_size = 100, m.hidden_size = 16, m.num_hidden_layers = 1, m.num_attention_heads = 2;
  m.num_key_value_heads = 1, m.head_dim = 8, m.intermediate_size = 16, m.num_experts = 0;
  m.family = policy::ModelFamily::llama, m.max_position_embeddings = 128;
  auto b = actors::make_policy(c);
  EXPECT_TRUE(b.ok()) << b.error().message;
  auto& model = *b->model;
  const auto& tok = *b->tokenizer;
  std::vector<float> p(model.params().begin(), model.params().end());
  const auto* norm = model.find_tensor("model.norm.weight");
  const auto* head = model.find_tensor("lm_head.weight");
  EXPECT_TRUE(norm && head);
  for (size_t i = 0; i < norm->numel(); ++i) p[norm->offset + i] = i == 0 ? 1.0f : 0.0f;
  for (size_t i = 0; i < head->numel(); ++i) p[head->offset + i] = 0.0f;
  const size_t C = static_cast<size_t>(m.hidden_size);
  p[head->offset + static_cast<size_t>((*tok.encode("7"))[0]) * C] = 50.0f;
  p[head->offset + static_cast<size_t>((*tok.encode("8"))[0]) * C] = -50.0f;
  EXPECT_TRUE(model.set_params(p).ok());
  EXPECT_TRUE(policy::io::save_model(dir.string(), model, &tok, policy::io::ExpertLayout::per_expert, tok.bos_id(),
                                     tok.eos_id(), tok.pad_id())
                  .ok());
  return dir.string();
}

class MuteScorer : public runtime::Actor {
 public:
  MuteScorer() {
    handle<actors::ScoreReq>([](runtime::Context&, const actors::ScoreReq&) -> Status { return {}; });
  }
};

TEST(JudgeModel, ScoresThroughTheScorers) {
  const fs::path root = fs::temp_directory_path() / ("troupe-judge-model-" + std::to_string(::getpid()));
  fs::create_directories(root);
  const std::string path = save_judge_model(root / "judge");
  std::ofstream(root / "rows.jsonl") << R"({"question": "1+1", "answer": "2"})" "\n";
  const json config = {{"train", (root / "rows.jsonl").string()},
                       {"eval_fraction", 0.0},
                       {"verifier", "none"},
                       {"judge",
                        {{"model", path},
                         {"rubric", "Q: {prompt} A: {response} Score:"},
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
  EXPECT_TRUE(j == 0.7 || j == 0.8) << j;
  EXPECT_DOUBLE_EQ(v->reward, j);
  auto again = (*env)->verify(obs->metadata, "2");  // greedy: the same verdict
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->components.at("judge"), j);

  // an env worker's verify of a group: its reply carries what the judge's scorer requests cost
  // (the step rows' scorer/judge/*), each completion verified on a thread of its own
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
  const auto& js = rep->judge_scorer;
  EXPECT_EQ(js.requests, 3);
  EXPECT_EQ(js.failures, 3);  // each first tried the silent scorer 0
  EXPECT_EQ(js.retries, 3);
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
