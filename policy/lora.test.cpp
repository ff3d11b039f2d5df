// LoRA on the policy model: the adapter arena's names and order, forward against a model whose
// base holds the merged weights W + s B A, finite-difference gradients of A and B, a frozen base,
// the device path (cpu_fenced) bit for bit, and every bad configuration's message.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "lora_test_models.h"

namespace troupe::policy {
namespace {

PackedBatch sample_batch(int V) { return test::random_batch(V, {6, 2, 9}, 5); }
double run_loss(Model& m, const PackedBatch& b, bool backward) { return test::weighted_loss(m, b, 0.9f, backward); }
const auto& kNoExperts = test::kLoraNoExperts;
using test::lora_model;

using test::batch_of;
using test::tiny;
using test::tiny_family;

LoraConfig lora(int r, std::vector<LoraTarget> targets = {LoraTarget::all_linear}) {
  LoraConfig l;
  l.rank = r;
  l.alpha = 16;
  l.targets = std::move(targets);
  return l;
}

// The base with W += scale * B A for every adapter: what PEFT's merge computes.
Model merged_copy(const Model& m, const ModelConfig& base_cfg) {
  auto created = Model::create(base_cfg, 0);
  EXPECT_TRUE(created.ok());
  Model out = std::move(created.value());
  std::vector<float> base(m.base_params().begin(), m.base_params().end());
  const auto ad = m.params();
  const int r = m.config().lora.rank;
  const float s = m.config().lora.scale();
  for (const auto& a : m.tensors()) {
    if (!a.name.ends_with(".lora_A.weight")) continue;
    const std::string module = a.name.substr(17, a.name.size() - 17 - 14);  // strip base_model.model. / .lora_A.weight
    const TensorSpec* b = m.find_tensor("base_model.model." + module + ".lora_B.weight");
    const TensorSpec* w = m.find_base_tensor(module + ".weight");
    EXPECT_TRUE(b && w) << module;
    const int64_t out_f = w->shape[0], in_f = w->shape[1];
    for (int64_t o = 0; o < out_f; ++o)
      for (int64_t i = 0; i < in_f; ++i) {
        double acc = 0;
        for (int k = 0; k < r; ++k) acc += double(ad[b->offset + o * r + k]) * ad[a.offset + k * in_f + i];
        base[w->offset + o * in_f + i] += static_cast<float>(s * acc);
      }
  }
  EXPECT_TRUE(out.set_params(base).ok());
  return out;
}

TEST(Lora, AdapterArenaNamesAndOrder) {
  Model m = lora_model(tiny_family("qwen2"), lora(2));
  const auto& t = m.tensors();
  ASSERT_EQ(t.size(), 3u * 7 * 2);  // 3 layers x q,k,v,o,gate,up,down x A,B
  EXPECT_EQ(t[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(t[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(t[1].shape, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(t[13].name, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(t[14].name, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(m.params().size(), t.back().offset + t.back().numel());
  EXPECT_EQ(m.grads().size(), m.params().size());
  EXPECT_NE(m.find_base_tensor("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(m.find_tensor("model.embed_tokens.weight"), nullptr);
  // qwen2_moe: adapters on attention and the gated shared expert, named as HF's module.
  Model q = lora_model(tiny_family("qwen2_moe"), lora(2, kNoExperts));
  EXPECT_NE(q.find_tensor("base_model.model.model.layers.1.mlp.shared_expert.gate_proj.lora_A.weight"), nullptr);
  EXPECT_NE(q.find_tensor("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"), nullptr);  // dense layer 0
  Model only_v = lora_model(tiny_family("llama"), lora(3, {LoraTarget::v}));
  EXPECT_EQ(only_v.tensors().size(), 3u * 2);
}

// B = 0 at init: the model computes exactly what its base computes.
TEST(Lora, FreshAdapterLeavesTheModelUnchanged) {
  for (LoraInit init : {LoraInit::kaiming_uniform, LoraInit::gaussian}) {
    ModelConfig c = tiny_family("qwen3");
    Model base = test::make(c);
    Model m = test::make(c);
    LoraConfig l = lora(4);
    l.init = init;
    ASSERT_TRUE(m.enable_lora(l, 9).ok());
    PackedBatch b = sample_batch(c.vocab_size);
    std::vector<float> x(b.tokens.size() * c.vocab_size), y(x.size());
    ASSERT_TRUE(base.forward_logits(b, x.data()).ok());
    ASSERT_TRUE(m.forward_logits(b, y.data()).ok());
    EXPECT_EQ(x, y);
    // A is drawn (nonzero, seeded), B is zero.
    double a2 = 0, b2 = 0;
    for (const auto& t : m.tensors())
      for (size_t i = 0; i < t.numel(); ++i) (t.name.ends_with("lora_A.weight") ? a2 : b2) += m.params()[t.offset + i] * m.params()[t.offset + i];
    EXPECT_GT(a2, 0);
    EXPECT_EQ(b2, 0);
    Model again = test::make(c);
    ASSERT_TRUE(again.enable_lora(l, 9).ok());
    EXPECT_TRUE(std::equal(m.params().begin(), m.params().end(), again.params().begin()));
  }
}

TEST(Lora, ForwardEqualsMergedWeights) {
  for (const char* fam : {"llama", "qwen2", "qwen3", "qwen2_moe"}) {
    ModelConfig c = tiny_family(fam);
    const bool moe = std::string(fam) == "qwen2_moe";
    for (bool rs : {false, true}) {
      LoraConfig l = lora(3, moe ? kNoExperts : std::vector<LoraTarget>{LoraTarget::all_linear});
      l.use_rslora = rs;
      Model m = lora_model(c, l);
      Model merged = merged_copy(m, c);
      PackedBatch b = sample_batch(c.vocab_size);
      std::vector<float> x(b.tokens.size() * c.vocab_size), y(x.size());
      ASSERT_TRUE(m.forward_logits(b, x.data()).ok());
      ASSERT_TRUE(merged.forward_logits(b, y.data()).ok());
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-4 + 2e-4 * std::fabs(y[i])) << fam << " " << i;
    }
  }
}

// Central differences in fp32 on every adapter tensor (as Model.FiniteDifferenceGradients).
TEST(Lora, FiniteDifferenceGradients) {
  for (const char* fam : {"llama", "qwen3", "qwen2_moe"}) {
    ModelConfig c = tiny_family(fam);
    Model m = lora_model(c, lora(2, kNoExperts));
    PackedBatch b = sample_batch(c.vocab_size);
    m.zero_grads();
    run_loss(m, b, true);
    std::vector<float> g(m.grads().begin(), m.grads().end());
    test::check_adapter_gradients(m, b, g, 2e-3, 2e-2, fam);
  }
}

// Steps that write the adapters leave every base weight as it was; the gradients are the adapters'.
TEST(Lora, BaseStaysFrozen) {
  ModelConfig c = tiny_family("qwen2_moe");
  Model m = lora_model(c, lora(2, kNoExperts));
  const std::vector<float> base0(m.base_params().begin(), m.base_params().end());
  const std::vector<float> ad0(m.params().begin(), m.params().end());
  PackedBatch b = sample_batch(c.vocab_size);
  for (int step = 0; step < 3; ++step) {
    m.zero_grads();
    run_loss(m, b, true);
    auto p = m.params();
    auto g = m.grads();
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.1f * g[i];
  }
  EXPECT_TRUE(std::equal(base0.begin(), base0.end(), m.base_params().begin()));
  EXPECT_FALSE(std::equal(ad0.begin(), ad0.end(), m.params().begin()));
}

// Checkpointing, the packed-metadata switch and the device path give the plain LoRA path's bits.
TEST(Lora, OptimizationsAndDevicePathMatch) {
  ModelConfig c = tiny_family("qwen2");
  PackedBatch b = sample_batch(c.vocab_size);
  Model plain = lora_model(c, lora(2));
  plain.zero_grads();
  const double l0 = run_loss(plain, b, true);
  for (int variant = 0; variant < 3; ++variant) {
    ModelConfig v = c;
    if (variant == 0) v.activation_checkpointing = true;
    if (variant == 1) v.cache_packed_metadata = false;
    if (variant == 2) v.device = kernels::DeviceKind::cpu_fenced;
    Model m = lora_model(v, lora(2));
    m.zero_grads();
    EXPECT_EQ(run_loss(m, b, true), l0) << variant;
    const auto g0 = plain.grads(), g = m.grads();
    ASSERT_EQ(g.size(), g0.size());
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], g0[i]) << variant << " " << i;
  }
}

Status check(const LoraConfig& l, const ModelConfig& c) { return validate_lora(l, c); }
std::string message(const Status& s) { return s.ok() ? "ok" : s.error().message; }

TEST(Lora, BadConfigurationsNameTheKeyAndValue) {
  const ModelConfig dense = tiny_family("qwen3"), moe = tiny_family("qwen3_moe");
  LoraConfig l = lora(-1);
  EXPECT_EQ(message(check(l, dense)), "policy.lora.rank: must be >= 0 (0 = off), got -1");
  l = lora(17);  // k_proj is (16 -> 16)
  EXPECT_NE(message(check(l, dense)).find("policy.lora.rank: 17 exceeds min(in, out) = 16 of model.layers.0.self_attn.q_proj"),
            std::string::npos) << message(check(l, dense));
  l = lora(2, {LoraTarget::experts});
  EXPECT_NE(message(check(l, dense)).find("policy.lora.targets: experts matches no module"), std::string::npos);
  EXPECT_EQ(message(check(l, moe)), "ok");  // routed experts (policy.lora_experts)
  l = lora(2);
  EXPECT_EQ(message(check(l, moe)), "ok");
  l = lora(2);
  l.alpha = -1;
  EXPECT_NE(message(check(l, dense)).find("policy.lora.alpha: must be finite and >= 0, got -1"), std::string::npos);
  l = lora(2);
  l.dropout = -0.5f;
  EXPECT_NE(message(check(l, dense)).find("policy.lora.dropout: must be in [0, 1), got -0.5"), std::string::npos);
  l.dropout = 0.1f;
  EXPECT_EQ(message(check(l, dense)), "ok");
  l = lora(2, {});
  EXPECT_NE(message(check(l, dense)).find("policy.lora.targets: names no module kind"), std::string::npos);
  // Model::create and enable_lora refuse them too.
  ModelConfig c = dense;
  c.lora = lora(17);
  EXPECT_FALSE(Model::create(c).ok());
  Model m = test::make(dense);
  EXPECT_FALSE(m.enable_lora(lora(2, {LoraTarget::experts}), 1).ok());
  EXPECT_FALSE(m.lora_enabled());
  ASSERT_TRUE(m.enable_lora(lora(2), 1).ok());
  EXPECT_NE(message(m.enable_lora(lora(2), 1)).find("already on"), std::string::npos);
}

}  // namespace
}  // namespace troupe::policy
