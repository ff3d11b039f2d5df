// policy.lora_merge_golden: troupe's merge of the PEFT-made adapters (tests/peft/) equals PEFT's
// merge_and_unload() weights within 1e-6, and the merged model, saved and reloaded by troupe's own
// model-dir code, gives the PeftModel's logits (transformers, fp32) within the golden tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_temp_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/peft_adapter.h"

namespace fs = std::filesystem;
using namespace troupe::policy;
using namespace troupe::policy::io;
using nlohmann::json;

namespace {

fs::path peft_fixture(const std::string& name) {
  const char* dir = std::getenv("TROUPE_PEFT_FIXTURES");
  return fs::path(dir ? dir : "tests/peft") / name;
}
fs::path hf_fixture(const std::string& name) {
  const char* dir = std::getenv("TROUPE_HF_FIXTURES");
  return fs::path(dir ? dir : "tests/hf_fixture") / name;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

const char* const kCases[] = {"llama", "qwen3", "qwen3_rslora"};

std::string base_of(const std::string& c) { return c == "llama" ? "llama" : "qwen3"; }

// The PeftModel's logits (T x V) against the model's, |d| <= 5e-5 + 1e-5·|ref| (the hf_fixture tolerance).
void expect_logits(Model& model, const json& expected, const std::string& what) {
  PackedBatch b;
  b.tokens = expected["tokens"].get<std::vector<int32_t>>();
  b.cu_seqlens = {0, static_cast<int32_t>(b.tokens.size())};
  b.targets.assign(b.tokens.size(), -1);
  const size_t V = expected["vocab_size"].get<size_t>();
  std::vector<float> logits(b.tokens.size() * V);
  auto st = model.forward_logits(b, logits.data());
  ASSERT_TRUE(st.ok()) << st.error().message;
  const auto ref = expected["logits"].get<std::vector<float>>();
  ASSERT_EQ(ref.size(), logits.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(logits[i]) - ref[i]);
    worst = std::max(worst, d);
    ASSERT_LE(d, 5e-5 + 1e-5 * std::fabs(ref[i])) << what << " logit " << i;
  }
  std::printf("%s: max |logit - PEFT| = %.3g\n", what.c_str(), worst);
}

}  // namespace

TEST(LoraMerge, EqualsPeftMergeAndUnload) {
  for (const std::string c : kCases) {
    auto dir = load_model_dir(hf_fixture(base_of(c)).string());
    ASSERT_TRUE(dir.ok()) << dir.error().message;
    auto base = hf_tensors_from_canonical(dir.value().config, dir.value().tensors, ExpertLayout::per_expert);
    ASSERT_TRUE(base.ok()) << base.error().message;
    auto adapter = read_peft_adapter((peft_fixture(c) / "adapter").string());
    ASSERT_TRUE(adapter.ok()) << adapter.error().message;
    TensorMap merged = base.value();
    auto st = merge_lora(merged, adapter.value());
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto peft = read_safetensors((peft_fixture(c) / "merged.safetensors").string());
    ASSERT_TRUE(peft.ok()) << peft.error().message;
    ASSERT_EQ(peft.value().size(), merged.size()) << c;
    double worst = 0;
    int changed = 0;
    for (const auto& [name, t] : peft.value()) {
      ASSERT_TRUE(merged.count(name)) << c << " " << name;
      const Tensor& m = merged.at(name);
      ASSERT_EQ(m.shape, t.shape) << name;
      bool differs = false;
      for (size_t i = 0; i < t.data.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(m.data[i] - t.data[i])));
        differs |= base.value().at(name).data[i] != m.data[i];
      }
      changed += differs;
    }
    EXPECT_LE(worst, 1e-6) << c;
    EXPECT_EQ(changed, 14) << c;  // every adapted projection moved, nothing else
    std::printf("%s: max |troupe merge - PEFT merge| = %.3g\n", c.c_str(), worst);
  }
}

TEST(LoraMerge, MergedModelGivesPeftLogits) {
  for (const std::string c : kCases) {
    const json expected = read_json(peft_fixture(c) / "expected.json");
    auto loaded = load_model(hf_fixture(base_of(c)).string());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    Model& model = loaded.value().model;
    auto adapter = read_peft_adapter((peft_fixture(c) / "adapter").string(), model.tensors());
    ASSERT_TRUE(adapter.ok()) << adapter.error().message;
    // The flat-buffer merge equals the by-name merge bit for bit.
    auto by_name = hf_tensors_from_canonical(model.config(), model_tensors(model).value(), ExpertLayout::per_expert).value();
    ASSERT_TRUE(merge_lora(by_name, adapter.value()).ok());
    ASSERT_TRUE(merge_lora(model.params(), model.tensors(), adapter.value()).ok());
    auto flat = hf_tensors_from_canonical(model.config(), model_tensors(model).value(), ExpertLayout::per_expert).value();
    for (const auto& [name, t] : by_name) EXPECT_EQ(flat.at(name).data, t.data) << name;
    expect_logits(model, expected, c + " merged in memory");
    // Saved as a model directory and loaded back by the existing loader.
    const fs::path out = troupe::policy::io::testing::make_temp_dir("lora_merge", c);
    ASSERT_TRUE(save_model(out.string(), model).ok());
    auto reloaded = load_model(out.string());
    ASSERT_TRUE(reloaded.ok()) << reloaded.error().message;
    expect_logits(reloaded.value().model, expected, c + " merged dir");
  }
}

TEST(LoraMerge, ChangesNothingOnError) {
  auto dir = load_model_dir(hf_fixture("llama").string());
  ASSERT_TRUE(dir.ok());
  TensorMap base = hf_tensors_from_canonical(dir.value().config, dir.value().tensors, ExpertLayout::per_expert).value();
  auto adapter = read_peft_adapter((peft_fixture("qwen3") / "adapter").string());  // k_proj (48, 64): not llama's
  ASSERT_TRUE(adapter.ok());
  const TensorMap before = base;
  auto st = merge_lora(base, adapter.value());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("k_proj"), std::string::npos) << st.error().message;
  for (const auto& [name, t] : before) EXPECT_EQ(base.at(name).data, t.data) << name;
}

// MoE experts are adapted under their per-expert names (the Model's table points into the fused
// expert blocks): the flat merge equals the by-name one and moves exactly W by s·B·A.
TEST(LoraMerge, ExpertModulesOfMoeFamilies) {
  for (const std::string fam : {"qwen3_moe", "mixtral"}) {
    auto loaded = load_model(hf_fixture(fam).string());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    Model& model = loaded.value().model;
    const std::string module = fam == "mixtral" ? "model.layers.1.block_sparse_moe.experts.1.w2"
                                                : "model.layers.1.mlp.experts.1.down_proj";
    const TensorSpec* w = model.find_tensor(module + ".weight");
    ASSERT_NE(w, nullptr) << module;
    const int64_t out = w->shape[0], in = w->shape[1], r = 2;
    PeftAdapter a;
    a.config.r = r;
    a.config.lora_alpha = 3;
    Tensor A{{r, in}, {}}, B{{out, r}, {}};
    for (int64_t i = 0; i < r * in; ++i) A.data.push_back(0.01f * static_cast<float>(i % 17) - 0.05f);
    for (int64_t i = 0; i < out * r; ++i) B.data.push_back(0.02f * static_cast<float>(i % 13) - 0.1f);
    a.tensors[lora_a_name(module)] = A;
    a.tensors[lora_b_name(module)] = B;
    const std::vector<float> before(model.params().begin(), model.params().end());
    auto by_name = hf_tensors_from_canonical(model.config(), model_tensors(model).value(), ExpertLayout::per_expert).value();
    ASSERT_TRUE(merge_lora(by_name, a).ok());
    ASSERT_TRUE(merge_lora(model.params(), model.tensors(), a).ok());
    EXPECT_EQ(by_name.at(module + ".weight").data,
              std::vector<float>(model.params().begin() + w->offset, model.params().begin() + w->offset + w->numel()));
    size_t moved = 0;
    for (size_t i = 0; i < before.size(); ++i) moved += before[i] != model.params()[i];
    EXPECT_GT(moved, 0u);
    EXPECT_LE(moved, w->numel()) << fam << ": values outside " << module << " changed";
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double ba = 0;
        for (int64_t k = 0; k < r; ++k) ba += static_cast<double>(B.data[o * r + k]) * A.data[k * in + i];
        const size_t at = w->offset + o * in + i;
        ASSERT_NEAR(model.params()[at] - before[at], 1.5 * ba, 1e-6) << fam << " [" << o << ", " << i << "]";
      }
  }
}
