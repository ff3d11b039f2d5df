// policy.hf_fixture: each transformers-made directory under tests/hf_fixture loads as is and gives
// the log-probs transformers computed (expected.json), and greedy decoding continues the prompt as
// transformers' generate did; a troupe save of the loaded model scores the same.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "troupe/base/build_config.h"
#include "troupe/policy/io/model_io.h"

namespace fs = std::filesystem;
using namespace troupe::policy;
using nlohmann::json;

namespace {

constexpr double kTol = 5e-5;  // fp32 both sides (measured ~3e-6); log-probs are O(5)

fs::path fixture(const std::string& sub) { return fs::path(TROUPE_SOURCE_DIR) / "tests" / "hf_fixture" / sub; }

void check_logprobs(Model& model, const json& expected, const std::string& what) {
  for (const auto& c : expected["cases"]) {
    const auto tokens = c["tokens"].get<std::vector<int32_t>>();
    const auto want = c["logprobs"].get<std::vector<double>>();
    auto got = io::score_tokens(model, tokens);
    ASSERT_TRUE(got.ok()) << got.error().message;
    ASSERT_EQ(got->size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs((*got)[i] - want[i]));
      EXPECT_NEAR((*got)[i], want[i], kTol) << what << " token " << i + 1;
    }
    std::printf("%s: %zu log-probs, max |ours - transformers| = %.3g\n", what.c_str(), want.size(), worst);
  }
}

}  // namespace

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, LogprobsAndGreedyMatchTransformers) {
  const fs::path dir = fixture(GetParam());
  std::ifstream in(dir / "expected.json");
  ASSERT_TRUE(in) << dir;
  const json e = json::parse(in);
  auto loaded = io::load_model(dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  check_logprobs(loaded->model, e, GetParam() + " (transformers " + e["versions"]["transformers"].get<std::string>() + ")");

  // The tokenizer reproduces the ids transformers scored.
  ASSERT_TRUE(loaded->tokenizer);
  EXPECT_EQ(*loaded->tokenizer->encode(e["cases"][0]["text"].get<std::string>()),
            e["cases"][0]["tokens"].get<std::vector<int32_t>>());

  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_new_tokens = static_cast<int>(e["greedy"]["new_tokens"].size());
  auto gen = loaded->model.generate({e["greedy"]["prompt_tokens"].get<std::vector<int32_t>>()}, sp);
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ((*gen)[0].tokens, e["greedy"]["new_tokens"].get<std::vector<int32_t>>());

  // Our save of it (per-expert and fused) loads back to the same log-probs.
  for (auto layout : {io::ExpertLayout::per_expert, io::ExpertLayout::fused}) {
    fs::path out = fs::temp_directory_path() / ("troupe_hf_fixture_" + GetParam() + "_" + std::to_string(::getpid()));
    fs::remove_all(out);
    ASSERT_TRUE(io::save_model(out.string(), loaded->model, loaded->tokenizer.get(), layout, loaded->bos_token_id,
                               loaded->eos_token_id, loaded->pad_token_id)
                    .ok());
    auto again = io::load_model(out.string());
    ASSERT_TRUE(again.ok()) << again.error().message;
    check_logprobs(again->model, e, GetParam() + " saved by troupe");
    fs::remove_all(out);
  }
}

INSTANTIATE_TEST_SUITE_P(Dirs, HfFixture,
                         ::testing::Values("mixtral", "mixtral_fused", "qwen3_moe", "qwen3_moe_fused",
                                           "llama", "llama_tied", "llama_bf16", "qwen2", "qwen3",
                                           "qwen2_moe"));
