// LoRA on routed MoE experts (policy.lora targets: experts): PEFT's names per expert
// (mlp.experts.N.gate_proj, Mixtral's block_sparse_moe.experts.N.w1), a fresh adapter changing
// nothing, the forward against the merged weights (PEFT's merge through io::merge_lora), grouped
// routing and the masked loop bit for bit, finite-difference gradients, cpu_fenced bit for bit,
// and the adapter written and read back in PEFT's layout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "lora_test_models.h"
#include "troupe/policy/io/peft_adapter.h"

namespace troupe::policy {
namespace {

PackedBatch sample_batch(int V) { return test::random_batch(V, {6, 2, 9, 5}, 5); }
using test::grads_of;
using test::lora_model;


LoraConfig lora(std::vector<LoraTarget> targets) {
  LoraConfig l;
  l.rank = 2;
  l.alpha = 8;
  l.targets = std::move(targets);
  return l;
}

TEST(LoraExperts, NamesFollowPeft) {
  Model q = lora_model(test::tiny("qwen3_moe"), lora({LoraTarget::experts}));
  // layers 1 and 2 are MoE (layer 0 dense): 4 experts x gate, up, down x A, B each
  ASSERT_EQ(q.tensors().size(), 2u * 4 * 3 * 2);
  EXPECT_EQ(q.tensors()[0].name, "base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight");
  EXPECT_EQ(q.tensors()[0].shape, (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(q.tensors()[1].shape, (std::vector<int64_t>{12, 2}));
  EXPECT_EQ(q.tensors()[5].name, "base_model.model.model.layers.1.mlp.experts.0.down_proj.lora_B.weight");
  EXPECT_EQ(q.tensors()[5].shape, (std::vector<int64_t>{16, 2}));
  EXPECT_EQ(q.tensors()[6].name, "base_model.model.model.layers.1.mlp.experts.1.gate_proj.lora_A.weight");
  Model x = lora_model(test::tiny("mixtral"), lora({LoraTarget::experts}));
  EXPECT_NE(x.find_tensor("base_model.model.model.layers.2.block_sparse_moe.experts.3.w1.lora_A.weight"), nullptr);
  EXPECT_NE(x.find_tensor("base_model.model.model.layers.2.block_sparse_moe.experts.3.w2.lora_B.weight"), nullptr);
  // all_linear on an MoE model: attention, the dense layer's MLP and every expert
  Model all = lora_model(test::tiny("qwen3_moe"), lora({LoraTarget::all_linear}));
  EXPECT_EQ(all.tensors().size(), (3u * 4 + 3 + 2 * 4 * 3) * 2);
}

TEST(LoraExperts, FreshAdapterChangesNothingAndForwardEqualsMerged) {
  for (const char* fam : {"qwen3_moe", "mixtral", "qwen2_moe"}) {
    SCOPED_TRACE(fam);
    const ModelConfig cf = test::tiny_family(fam);
    const PackedBatch b = sample_batch(cf.vocab_size);
    std::vector<float> x(b.tokens.size() * cf.vocab_size), y(x.size());
    Model base = test::make(cf, 7);
    test::randomize_weights(base, 7);
    ASSERT_TRUE(base.forward_logits(b, x.data()).ok());
    Model fresh = test::make(cf, 7);
    test::randomize_weights(fresh, 7);
    ASSERT_TRUE(fresh.enable_lora(lora({LoraTarget::experts}), 7).ok());
    ASSERT_TRUE(fresh.forward_logits(b, y.data()).ok());
    EXPECT_EQ(x, y);
    // W + s B A merged into the base as PEFT merges it (io::merge_lora by the adapters' PEFT names)
    Model m = lora_model(cf, lora({LoraTarget::experts}));
    io::PeftAdapter ad;
    for (const auto& t : m.tensors())
      ad.tensors[t.name] = io::Tensor{t.shape, std::vector<float>(m.params().begin() + static_cast<std::ptrdiff_t>(t.offset),
                                                                  m.params().begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel()))};
    ad.config.r = 2;
    ad.config.lora_alpha = 8;
    std::vector<float> merged(m.base_params().begin(), m.base_params().end());
    ASSERT_TRUE(io::merge_lora(merged, m.base_tensors(), ad).ok());
    ASSERT_TRUE(base.set_params(merged).ok());
    ASSERT_TRUE(m.forward_logits(b, x.data()).ok());
    ASSERT_TRUE(base.forward_logits(b, y.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4 + 2e-4 * std::fabs(y[i])) << i;
  }
}

// The masked loop (policy.moe_grouped: false) and cpu_fenced give the grouped path's bits.
TEST(LoraExperts, GroupedMaskedAndDevicePathMatch) {
  const ModelConfig c = test::tiny("qwen3_moe");
  const PackedBatch b = sample_batch(c.vocab_size);
  Model grouped = lora_model(c, lora({LoraTarget::all_linear}));
  double l0 = 0;
  const auto g0 = grads_of(grouped, b, &l0);
  double gsum = 0;
  for (const auto& t : grouped.tensors())
    if (t.name.find(".experts.") != std::string::npos)
      for (size_t i = 0; i < t.numel(); ++i) gsum += std::fabs(g0[t.offset + i]);
  EXPECT_GT(gsum, 0.0);  // the experts' adapters get gradients
  for (int variant = 0; variant < 3; ++variant) {
    ModelConfig v = c;
    if (variant == 0) v.moe_grouped = false;
    if (variant == 1) v.device = kernels::DeviceKind::cpu_fenced;
    if (variant == 2) v.activation_checkpointing = true;
    Model m = lora_model(v, lora({LoraTarget::all_linear}));
    double l = 0;
    EXPECT_EQ(grads_of(m, b, &l), g0) << variant;
    EXPECT_EQ(l, l0) << variant;
  }
}

TEST(LoraExperts, FiniteDifferenceGradients) {
  for (const char* fam : {"qwen3_moe", "mixtral"}) {
    const ModelConfig c = test::tiny(fam);
    Model m = lora_model(c, lora({LoraTarget::experts}));
    const PackedBatch b = sample_batch(c.vocab_size);
    double l0 = 0;
    const auto g = grads_of(m, b, &l0);
    test::check_adapter_gradients(m, b, g, 3e-3, 3e-2, fam);
  }
}

// Written in PEFT's layout and read back: the same tensors bit for bit, target_modules the experts'
// full module paths (PEFT would otherwise also match other gate_proj modules by their leaf name).
TEST(LoraExperts, AdapterRoundTrip) {
  Model m = lora_model(test::tiny("qwen3_moe"), lora({LoraTarget::experts}));
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_lora_experts_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  io::PeftAdapterConfig pc;
  pc.r = 2;
  pc.lora_alpha = 8;
  ASSERT_TRUE(io::write_peft_adapter(dir.string(), pc, m.tensors(), m.params()).ok());
  auto back = io::read_peft_adapter(dir.string(), m.base_tensors());
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ(back->tensors.size(), m.tensors().size());
  for (const auto& t : m.tensors()) {
    const auto it = back->tensors.find(t.name);
    ASSERT_NE(it, back->tensors.end()) << t.name;
    ASSERT_TRUE(std::equal(it->second.data.begin(), it->second.data.end(),
                           m.params().begin() + static_cast<std::ptrdiff_t>(t.offset)));
  }
  EXPECT_NE(std::find(back->config.target_modules.begin(), back->config.target_modules.end(),
                      "model.layers.2.mlp.experts.3.down_proj"),
            back->config.target_modules.end());
  std::filesystem::remove_all(dir);
}

TEST(LoraExperts, BadConfigurations) {
  LoraConfig l = lora({LoraTarget::experts});
  l.dropout = 0.1f;
  auto s = validate_lora(l, test::tiny("qwen3_moe"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("policy.lora.dropout: 0.1"), std::string::npos) << s.error().message;
  s = validate_lora(lora({LoraTarget::experts}), test::tiny_family("qwen3"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("experts matches no module"), std::string::npos);
}

}  // namespace
}  // namespace troupe::policy
