// policy.reward_model: the pooled position, batch packing and every refusal of load_reward_model;
// policy.reward_model_golden: the transformers-made sequence-classification fixtures of
// tests/reward_model/ (make_reward_fixtures.py) rendered, tokenized and scored as transformers did.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_temp_dir.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/reward_model_dir.h"
#include "troupe/policy/io/safetensors.h"

namespace fs = std::filesystem;
using namespace troupe::policy;
using namespace troupe::policy::io;
using nlohmann::json;

namespace {

fs::path fixture(const std::string& name) {
  const char* dir = std::getenv("TROUPE_REWARD_FIXTURES");
  return fs::path(dir ? dir : "tests/reward_model") / name;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

void write_json(const fs::path& p, const json& j) {
  std::ofstream out(p);
  out << j.dump(2);
}

RewardModelDir load_ok(const fs::path& dir) {
  auto r = load_reward_model(dir.string());
  if (!r.ok()) ADD_FAILURE() << r.error().message;
  return std::move(r).value();
}

// Golden tolerance: |ours - transformers| <= 1e-5 + 1e-6·|ref| (fp32 forward, both sides).
void expect_scores(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    worst = std::max(worst, d);
    EXPECT_LE(d, 1e-5 + 1e-6 * std::fabs(ref[i])) << what << " value " << i << ": " << got[i] << " vs " << ref[i];
  }
  std::printf("%s: max |score - transformers| = %.3g\n", what.c_str(), worst);
}

void golden(const std::string& name) {
  const fs::path dir = fixture(name);
  const json expected = read_json(dir / "expected.json");
  RewardModelDir rm = load_ok(dir);
  EXPECT_EQ(rm.architecture, expected["architecture"].get<std::string>());
  EXPECT_EQ(rm.head.num_labels, expected["num_labels"].get<int>());
  EXPECT_EQ(rm.head.pad_token_id, expected["pad_token_id"].is_null() ? -1 : expected["pad_token_id"].get<int>());
  ASSERT_TRUE(rm.tokenizer);
  ASSERT_FALSE(rm.chat_template.empty());
  auto tmpl = ChatTemplate::parse(rm.chat_template, (dir / "chat_template.jinja").string());
  ASSERT_TRUE(tmpl.ok()) << tmpl.error().message;
  ChatRenderOptions opts = chat_options_for(rm.tokenizer.get(), rm.bos_token_id, rm.eos_token_id);
  opts.add_generation_prompt = false;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<float> ref, ref_first;
  for (const json& c : expected["cases"]) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::parse(c["messages"].dump());
    auto text = render_chat(tmpl.value(), messages, opts);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(text.value(), c["text"].get<std::string>());
    auto ids = rm.tokenizer->encode(text.value());
    ASSERT_TRUE(ids.ok()) << ids.error().message;
    EXPECT_EQ(ids.value(), c["tokens"].get<std::vector<int32_t>>());
    seqs.push_back(c["tokens"].get<std::vector<int32_t>>());
    for (float s : c["scores"].get<std::vector<float>>()) ref.push_back(s);
    ref_first.push_back(c["scores"][0].get<float>());
  }
  for (const json& r : expected["raw"]) {
    seqs.push_back(r["tokens"].get<std::vector<int32_t>>());
    for (float s : r["scores"].get<std::vector<float>>()) ref.push_back(s);
    ref_first.push_back(r["scores"][0].get<float>());
  }
  auto all = score_sequences_all(rm.model, rm.head, seqs);  // every case packed into one batch
  ASSERT_TRUE(all.ok()) << all.error().message;
  expect_scores(all.value(), ref, name + " (all labels)");
  auto first = score_sequences(rm.model, rm.head, seqs);
  ASSERT_TRUE(first.ok()) << first.error().message;
  expect_scores(first.value(), ref_first, name + " (label 0)");
}

TEST(RewardModelGolden, LlamaRewardModel) { golden("llama"); }
TEST(RewardModelGolden, Qwen3TwoLabels) { golden("qwen3"); }

TEST(RewardModel, ScoredPositionIsTheLastNonPadToken) {
  const std::vector<int32_t> a = {5, 6, 7}, b = {5, 6, 0, 0}, c = {0, 0}, d = {5, 0, 7};
  EXPECT_EQ(scored_position(a, 0), 2);
  EXPECT_EQ(scored_position(b, 0), 1);
  EXPECT_EQ(scored_position(c, 0), 0);
  EXPECT_EQ(scored_position(d, 0), 2);
  EXPECT_EQ(scored_position(b, -1), 3);  // no pad token: the last one
}

TEST(RewardModel, PackedBatchEqualsOneSequenceAtATime) {
  RewardModelDir rm = load_ok(fixture("llama"));
  const std::vector<std::vector<int32_t>> seqs = {{5, 17, 42}, {9, 8, 7, 6, 5, 4}, {3}, {100, 0, 0}};
  auto packed = score_sequences(rm.model, rm.head, seqs);
  ASSERT_TRUE(packed.ok()) << packed.error().message;
  for (size_t s = 0; s < seqs.size(); ++s) {
    auto one = score_sequences(rm.model, rm.head, {seqs[s]});
    ASSERT_TRUE(one.ok());
    EXPECT_NEAR(one.value()[0], packed.value()[s], 1e-6) << "sequence " << s;
  }
  auto none = score_sequences(rm.model, rm.head, {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none.value().empty());
}

TEST(RewardModel, BadSequencesAreErrorsNamingThem) {
  RewardModelDir rm = load_ok(fixture("llama"));
  auto empty = score_sequences(rm.model, rm.head, {{1, 2}, {}});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("sequence 1 is empty"), std::string::npos) << empty.error().message;
  auto oov = score_sequences(rm.model, rm.head, {{1, 2, 360}});
  ASSERT_FALSE(oov.ok());
  EXPECT_NE(oov.error().message.find("sequence 0 token 2 is 360"), std::string::npos) << oov.error().message;
  ScoreHead narrow = rm.head;
  narrow.weight.pop_back();
  auto bad_head = score_sequences(rm.model, narrow, {{1, 2}});
  ASSERT_FALSE(bad_head.ok());
  EXPECT_NE(bad_head.error().message.find("score head"), std::string::npos) << bad_head.error().message;
}

// A copy of the llama fixture with config.json edited and/or the weights rewritten.
fs::path variant(const std::string& name, const std::function<void(json&)>& edit_config,
                 const std::function<void(TensorMap&)>& edit_weights = {}) {
  const fs::path dir = troupe::policy::io::testing::make_temp_dir("reward", name);
  for (const auto& e : fs::directory_iterator(fixture("llama"))) fs::copy_file(e.path(), dir / e.path().filename());
  json cfg = read_json(dir / "config.json");
  edit_config(cfg);
  write_json(dir / "config.json", cfg);
  if (edit_weights) {
    auto w = read_safetensors((dir / "model.safetensors").string());
    EXPECT_TRUE(w.ok());
    TensorMap m = std::move(w).value();
    edit_weights(m);
    EXPECT_TRUE(write_safetensors((dir / "model.safetensors").string(), m, {{"format", "pt"}}).ok());
  }
  return dir;
}

void expect_refused(const fs::path& dir, const std::vector<std::string>& parts) {
  auto r = load_reward_model(dir.string());
  ASSERT_FALSE(r.ok()) << dir;
  for (const auto& p : parts) EXPECT_NE(r.error().message.find(p), std::string::npos) << r.error().message;
}

TEST(RewardModel, RefusalsNameTheFileAndKey) {
  const auto nothing = [](json&) {};
  expect_refused("/nonexistent/reward", {"/nonexistent/reward", "not a model directory"});
  expect_refused(variant("causal", [](json& j) { j["architectures"] = {"LlamaForCausalLM"}; }),
                 {"config.json", "'architectures'", "LlamaForCausalLM", "LlamaForSequenceClassification"});
  expect_refused(variant("no_arch", [](json& j) { j.erase("architectures"); }), {"config.json", "'architectures'"});
  expect_refused(variant("mismatch", [](json& j) { j["architectures"] = {"Qwen3ForSequenceClassification"}; }),
                 {"config.json", "'model_type' is llama", "expected qwen3"});
  expect_refused(variant("labels", [](json& j) {
                   j.erase("id2label");
                   j["num_labels"] = 0;
                 }),
                 {"config.json", "'num_labels'"});
  expect_refused(variant("pad", [](json& j) { j["pad_token_id"] = 1000; }), {"config.json", "'pad_token_id'", "1000"});
  expect_refused(variant("no_score", nothing, [](TensorMap& m) { m.erase("score.weight"); }),
                 {"model.safetensors", "missing tensor 'score.weight'", "1 x 64"});
  expect_refused(variant("two_labels", [](json& j) { j["id2label"] = {{"0", "a"}, {"1", "b"}}; }),
                 {"model.safetensors", "'score.weight' has shape (1, 64), expected (2, 64)"});
  expect_refused(variant("bias", nothing, [](TensorMap& m) { m["score.bias"] = Tensor{{1}, {0.5f}}; }),
                 {"model.safetensors", "'score.bias'"});
  expect_refused(variant("stray", nothing, [](TensorMap& m) { m["classifier.weight"] = Tensor{{1, 64}, std::vector<float>(64)}; }),
                 {"model.safetensors", "unexpected tensor 'classifier.weight'"});
  expect_refused(variant("no_layer", nothing, [](TensorMap& m) { m.erase("model.norm.weight"); }),
                 {"model.safetensors", "missing tensor 'model.norm.weight'"});
}

TEST(RewardModel, CheckDirReadsNoWeightsButCatchesConfigAndHead) {
  EXPECT_TRUE(check_reward_model_dir(fixture("llama").string()).ok());
  EXPECT_TRUE(check_reward_model_dir(fixture("qwen3").string()).ok());
  const auto nothing = [](json&) {};
  auto refused = [](const fs::path& dir, const std::string& part) {
    troupe::Status st = check_reward_model_dir(dir.string());
    ASSERT_FALSE(st.ok()) << dir;
    EXPECT_NE(st.error().message.find(part), std::string::npos) << st.error().message;
  };
  refused(variant("c_causal", [](json& j) { j["architectures"] = {"LlamaForCausalLM"}; }), "'architectures'");
  refused(variant("c_pad", [](json& j) { j["pad_token_id"] = -3; }), "'pad_token_id'");
  refused(variant("c_no_score", nothing, [](TensorMap& m) { m.erase("score.weight"); }), "missing tensor 'score.weight'");
  refused(variant("c_shape", [](json& j) { j["id2label"] = {{"0", "a"}, {"1", "b"}}; }), "expected (2, 64)");
  refused("/nonexistent/reward", "not a model directory");
}

TEST(RewardModel, NumLabelsFollowsTransformers) {
  // num_labels without id2label is read; neither gives transformers' default, 2.
  const fs::path three = variant("three", [](json& j) {
    j.erase("id2label");
    j["num_labels"] = 3;
  }, [](TensorMap& m) { m["score.weight"] = Tensor{{3, 64}, std::vector<float>(3 * 64, 0.25f)}; });
  EXPECT_EQ(load_ok(three).head.num_labels, 3);
  const fs::path dflt = variant("default", [](json& j) { j.erase("id2label"); },
                                [](TensorMap& m) { m["score.weight"] = Tensor{{2, 64}, std::vector<float>(2 * 64, 0.5f)}; });
  RewardModelDir rm = load_ok(dflt);
  EXPECT_EQ(rm.head.num_labels, 2);
  auto all = score_sequences_all(rm.model, rm.head, {{5, 6, 7}});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all.value().size(), 2u);
  EXPECT_EQ(all.value()[0], all.value()[1]);  // equal rows of the head give equal labels
}

}  // namespace
