// Tiny models and packed batches shared by the policy tests (model, device path, decode slots).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "troupe/policy/model.h"

namespace troupe::policy::test {

// A family by its config.json name (the tests name families as users do).
inline ModelFamily family_named(const std::string& name) { return *enum_from_name<ModelFamily>(name); }

// A 3-layer qwen3_moe (or mixtral) of width 16: 4 experts top-2, layer 0 dense.
inline ModelConfig tiny(const std::string& family = "qwen3_moe") {
  ModelConfig c;
  c.family = family_named(family);
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 24;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.mlp_only_layers = {0};
  c.router_aux_loss_coef = 0.01f;
  return c;
}

// tiny() for any family: llama with attention_bias and llama3 RoPE (original context 4, so a
// batch's positions cross all three bands), qwen2 with q/k/v biases, dense qwen3, qwen2_moe with
// its gated shared expert.
inline ModelConfig tiny_family(const std::string& family) {
  const bool dense = family == "llama" || family == "qwen2" || family == "qwen3";
  ModelConfig c = tiny(dense ? "qwen3_moe" : family);
  c.family = family_named(family);
  if (dense) c.num_experts = 0, c.mlp_only_layers.clear();
  if (family == "llama") {
    c.qkv_bias = c.o_proj_bias = true;
    c.rope_type = RopeType::llama3, c.rope_factor = 8, c.rope_original_max_position_embeddings = 4;
  }
  if (family == "qwen2" || family == "qwen2_moe") c.qkv_bias = true;
  if (family == "qwen2_moe") c.shared_expert_intermediate_size = 8;
  return c;
}

inline const char* const kAllFamilies[] = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral"};

// Larger weights than the init (N(0, 0.3) but the norms), so tests see non-trivial attention and
// routing; written through the host span params().
inline void randomize_weights(Model& model, uint64_t seed) {
  std::mt19937 g(static_cast<unsigned>(seed));
  std::normal_distribution<float> d(0.0f, 0.3f);
  auto p = model.params();
  for (const auto& t : model.tensors()) {
    if (t.name.find("norm") != std::string::npos) continue;
    for (size_t i = 0; i < t.numel(); ++i) p[t.offset + i] = d(g);
  }
}

// Model::create(c, seed) with randomize_weights(seed).
inline Model make(const ModelConfig& c, uint64_t seed = 7) {
  auto m = Model::create(c, seed);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  Model model = std::move(m.value());
  randomize_weights(model, seed);
  return model;
}

// The sequences packed, each token's target the next token of its sequence (-1 at its end).
inline PackedBatch batch_of(const std::vector<std::vector<int32_t>>& seqs) {
  PackedBatch b;
  b.cu_seqlens.push_back(0);
  for (const auto& s : seqs) {
    for (size_t i = 0; i < s.size(); ++i) {
      b.tokens.push_back(s[i]);
      b.targets.push_back(i + 1 < s.size() ? s[i + 1] : -1);
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  }
  return b;
}

// Sequences of the given lengths drawn uniformly from the vocabulary (mt19937 seeded), packed.
inline PackedBatch random_batch(int V, const std::vector<int>& lens, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::vector<int32_t>> seqs;
  for (int len : lens) {
    std::vector<int32_t> s(len);
    for (auto& t : s) t = static_cast<int32_t>(g() % V);
    seqs.push_back(s);
  }
  return batch_of(seqs);
}

// loss = aux + sum_t w1[t] logp[t] + w2[t] entropy[t] with fixed weights (sin / 0.1 cos); with
// `backward` its gradient accumulates into the model's grads; `logp` (if given) gets the log-probs.
inline double weighted_loss(Model& m, const PackedBatch& b, float temp, bool backward,
                            std::vector<float>* logp = nullptr) {
  const size_t T = b.tokens.size();
  std::vector<float> lp(T), ent(T), w1(T), w2(T);
  for (size_t t = 0; t < T; ++t)
    w1[t] = static_cast<float>(std::sin(1.0 + t)), w2[t] = 0.1f * static_cast<float>(std::cos(2.0 + t));
  auto st = m.forward_train(b, temp, lp.data(), ent.data());
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
  double L = m.last_aux_loss();
  for (size_t t = 0; t < T; ++t) L += static_cast<double>(w1[t]) * lp[t] + static_cast<double>(w2[t]) * ent[t];
  if (backward) {
    auto s2 = m.backward_train(w1.data(), w2.data());
    EXPECT_TRUE(s2.ok()) << (s2.ok() ? "" : s2.error().message);
  }
  if (logp) *logp = lp;
  return L;
}

}  // namespace troupe::policy::test
