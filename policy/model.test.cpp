// Tests of the policy model on tiny configs: tensor table and arenas, input validation, packed
// sequences never mixing, finite-difference gradients, the three switches against the plain path,
// and KV-cache sampling log-probs against a full forward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/offload.h"
#include "test_models.h"
#include "troupe/policy/model.h"

using namespace troupe::policy;
using namespace troupe::policy::test;

namespace {

PackedBatch sample_batch(int V) { return random_batch(V, {5, 1, 9, 3}, 3); }

// loss = aux + sum_t w1[t] logp[t] + w2[t] entropy[t] with fixed weights; returns loss and fills grads.
double run_loss(Model& m, const PackedBatch& b, float temp, bool backward) { return weighted_loss(m, b, temp, backward); }

}  // namespace

TEST(Model, TableFollowsHuggingFaceNames) {
  Model q = make(tiny("qwen3_moe"));
  EXPECT_NE(q.find_tensor("model.embed_tokens.weight"), nullptr);
  EXPECT_NE(q.find_tensor("model.layers.0.mlp.gate_proj.weight"), nullptr);  // dense layer 0
  EXPECT_NE(q.find_tensor("model.layers.1.mlp.gate.weight"), nullptr);
  EXPECT_NE(q.find_tensor("model.layers.1.mlp.experts.3.down_proj.weight"), nullptr);
  EXPECT_NE(q.find_tensor("model.layers.2.self_attn.q_norm.weight"), nullptr);
  EXPECT_NE(q.find_tensor("lm_head.weight"), nullptr);
  EXPECT_EQ(q.params().size(), q.grads().size());
  // Experts are contiguous: expert e+1 follows expert e in each of gate/up/down.
  auto* g0 = q.find_tensor("model.layers.1.mlp.experts.0.gate_proj.weight");
  auto* g1 = q.find_tensor("model.layers.1.mlp.experts.1.gate_proj.weight");
  EXPECT_EQ(g1->offset, g0->offset + g0->numel());
  EXPECT_EQ(g0->shape, (std::vector<int64_t>{12, 16}));
  size_t covered = 0;
  for (const auto& t : q.tensors()) covered += t.numel();
  EXPECT_EQ(covered, q.params().size());  // untied: the table tiles the arena exactly

  ModelConfig mc = tiny("mixtral");
  mc.tie_word_embeddings = true;
  Model x = make(mc);
  EXPECT_NE(x.find_tensor("model.layers.1.block_sparse_moe.gate.weight"), nullptr);
  EXPECT_NE(x.find_tensor("model.layers.1.block_sparse_moe.experts.2.w2.weight"), nullptr);
  EXPECT_EQ(x.find_tensor("model.layers.1.self_attn.q_norm.weight"), nullptr);
  EXPECT_EQ(x.find_tensor("lm_head.weight"), nullptr);  // tied

  Model l = make(tiny_family("llama"));
  EXPECT_EQ(l.find_tensor("model.layers.0.self_attn.q_proj.bias")->shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(l.find_tensor("model.layers.0.self_attn.o_proj.bias")->shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(l.find_tensor("model.layers.1.mlp.gate.weight"), nullptr);  // dense
  Model q2 = make(tiny_family("qwen2_moe"));
  EXPECT_NE(q2.find_tensor("model.layers.1.self_attn.v_proj.bias"), nullptr);
  EXPECT_EQ(q2.find_tensor("model.layers.1.self_attn.o_proj.bias"), nullptr);
  EXPECT_EQ(q2.find_tensor("model.layers.1.mlp.shared_expert_gate.weight")->shape,
            (std::vector<int64_t>{1, 16}));
  EXPECT_NE(q2.find_tensor("model.layers.1.mlp.shared_expert.up_proj.weight"), nullptr);
  EXPECT_NE(make(tiny_family("qwen3")).find_tensor("model.layers.0.self_attn.k_norm.weight"), nullptr);
}

// llama3 RoPE: short wavelengths kept, long ones divided by factor, the band between interpolated.
TEST(Model, Llama3RopeFrequencies) {
  ModelConfig c = tiny_family("llama");
  c.head_dim = 16, c.rope_theta = 10000, c.rope_original_max_position_embeddings = 64;
  const auto inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const float base = 1.0f / std::pow(10000.0f, 2.0f * i / 16.0f);
    const float wavelen = 6.2831853f / base;
    if (wavelen < 16) {
      EXPECT_FLOAT_EQ(inv[i], base) << i;
    } else if (wavelen > 64) {
      EXPECT_FLOAT_EQ(inv[i], base / 8) << i;
    } else {
      EXPECT_TRUE(inv[i] < base && inv[i] > base / 8) << i;
    }
  }
  c.rope_type = RopeType::unscaled;
  EXPECT_TRUE(rope_inv_freq(c).empty());
  c.rope_type = RopeType::linear, c.rope_factor = 2;
  EXPECT_FLOAT_EQ(rope_inv_freq(c)[1], 1.0f / std::pow(10000.0f, 2.0f / 16.0f) / 2);
}

// Every training optimization gives bit-identical losses and gradients for every family.
TEST(Model, OptimizationsMatchForEveryFamily) {
  for (const char* fam : kAllFamilies) {
    const ModelConfig base = tiny_family(fam);
    Model plain = make(base);
    PackedBatch b = sample_batch(base.vocab_size);
    plain.zero_grads();
    const double l_plain = run_loss(plain, b, 1.0f, true);
    std::vector<std::pair<std::string, ModelConfig>> variants;
    ModelConfig v = base;
    v.cache_packed_metadata = false;
    variants.push_back({"no metadata cache", v});
    v = base;
    v.activation_checkpointing = true;
    variants.push_back({"checkpointing", v});
    v.offload_activations = true;
    variants.push_back({"offload", v});
    v = base;
    v.moe_grouped = false;
    variants.push_back({"masked MoE", v});
    for (const auto& [what, cfg] : variants) {
      Model m = make(cfg);
      m.zero_grads();
      EXPECT_EQ(run_loss(m, b, 1.0f, true), l_plain) << fam << " " << what;
      for (size_t i = 0; i < m.grads().size(); ++i)
        ASSERT_EQ(m.grads()[i], plain.grads()[i]) << fam << " " << what << " " << i;
    }
  }
}

TEST(Model, DeterministicInit) {
  auto a = Model::create(tiny(), 5), b = Model::create(tiny(), 5), c = Model::create(tiny(), 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(std::equal(a->params().begin(), a->params().end(), b->params().begin()));
  EXPECT_FALSE(std::equal(a->params().begin(), a->params().end(), c->params().begin()));
}

TEST(Model, BadConfigAndBatchAreErrors) {
  ModelConfig c = tiny();
  c.num_key_value_heads = 3;
  auto r = Model::create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("num_key_value_heads"), std::string::npos);
  c = tiny_family("qwen2");
  c.qkv_bias = false;
  r = Model::create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("qkv_bias"), std::string::npos);
  c = tiny_family("qwen3");
  c.num_experts = 4;
  r = Model::create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("dense family"), std::string::npos) << r.error().message;
  c = tiny();
  c.mlp_only_layers = {9};
  EXPECT_FALSE(Model::create(c).ok());
  c = tiny();
  c.device = troupe::kernels::DeviceKind::cuda;  // no GPU, or the model not yet on device memory: a clear error, never the CPU
  r = Model::create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("device: 'cuda': "), std::string::npos) << r.error().message;
  EXPECT_EQ(make(tiny()).backend().name(), "cpu");

  Model m = make(tiny());
  std::vector<float> lp(8), ent(8);
  PackedBatch b = batch_of({{1, 2, 3}});
  b.tokens[1] = 99;
  auto s = m.forward_train(b, 1.0f, lp.data(), ent.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("tokens[1] = 99"), std::string::npos);
  b = batch_of({{1, 2, 3}});
  b.cu_seqlens = {0, 2};
  s = m.forward_train(b, 1.0f, lp.data(), ent.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("cu_seqlens"), std::string::npos);
  b = batch_of({{1, 2, 3}});
  EXPECT_FALSE(m.forward_train(b, 0.0f, lp.data(), ent.data()).ok());
  EXPECT_FALSE(m.backward_train(nullptr, nullptr).ok());  // no forward before it
  EXPECT_FALSE(m.set_params(std::vector<float>(3)).ok());
  // Empty sequences inside a batch are allowed (they contribute nothing).
  b = batch_of({{1, 2, 3}, {}, {4, 5}});
  ASSERT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 3, 3, 5}));
  EXPECT_TRUE(m.forward_train(b, 1.0f, lp.data(), ent.data()).ok());
  EXPECT_TRUE(m.backward_train(lp.data(), nullptr).ok());
}

// Packing never mixes sequences: each sequence's logits equal those of it run alone.
TEST(Model, PackedSequencesAreIndependent) {
  for (const char* fam : kAllFamilies) {
    Model m = make(tiny_family(fam));
    const int V = m.config().vocab_size;
    PackedBatch b = sample_batch(V);
    std::vector<float> all(b.tokens.size() * V);
    ASSERT_TRUE(m.forward_logits(b, all.data()).ok());
    for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s) {
      const int a = b.cu_seqlens[s], e = b.cu_seqlens[s + 1];
      PackedBatch one;
      one.tokens.assign(b.tokens.begin() + a, b.tokens.begin() + e);
      one.cu_seqlens = {0, e - a};
      std::vector<float> lg((e - a) * V);
      ASSERT_TRUE(m.forward_logits(one, lg.data()).ok());
      for (int i = 0; i < (e - a) * V; ++i) ASSERT_NEAR(lg[i], all[a * V + i], 2e-5) << fam << " seq " << s;
    }
  }
}

// Central differences in fp32 on a sample of parameters (the golden test checks every gradient
// against PyTorch; this one needs no Python). Tolerance: 2e-2 relative + 2e-3 absolute.
TEST(Model, FiniteDifferenceGradients) {
  for (const char* fam : {"dense", "qwen3_moe", "mixtral", "llama", "qwen2", "qwen3", "qwen2_moe"}) {
    const std::string f = fam;
    ModelConfig c = f == "dense" ? tiny("qwen3_moe") : tiny_family(f);
    if (f == "dense") c.num_experts = 0;
    if (f == "mixtral") c.shared_expert_intermediate_size = 8;
    Model m = make(c);
    PackedBatch b = sample_batch(c.vocab_size);
    m.zero_grads();
    run_loss(m, b, 0.9f, true);
    std::vector<float> g(m.grads().begin(), m.grads().end());
    std::mt19937 r(11);
    int checked = 0;
    for (const auto& t : m.tensors()) {
      for (int rep = 0; rep < 2; ++rep) {
        const size_t i = t.offset + r() % t.numel();
        float& p = m.params()[i];
        const float orig = p, h = 1e-3f;
        p = orig + h;
        const double lp = run_loss(m, b, 0.9f, false);
        p = orig - h;
        const double lm = run_loss(m, b, 0.9f, false);
        p = orig;
        const double num = (lp - lm) / (2 * h);
        EXPECT_NEAR(g[i], num, 2e-3 + 2e-2 * std::fabs(num)) << fam << " " << t.name << " [" << i - t.offset << "]";
        ++checked;
      }
    }
    EXPECT_GT(checked, 40);
  }
}

// Switch cache_packed_metadata: metadata built once per batch vs once per layer and pass; same numbers.
TEST(Model, PackedMetaCache) {
  ModelConfig c = tiny();
  Model on = make(c);
  c.cache_packed_metadata = false;
  Model off = make(c);
  PackedBatch b = sample_batch(c.vocab_size);
  on.zero_grads();
  off.zero_grads();
  const uint64_t b_on = on.packed_meta_builds(), b_off = off.packed_meta_builds();
  const double l_on = run_loss(on, b, 1.0f, true), l_off = run_loss(off, b, 1.0f, true);
  EXPECT_EQ(on.packed_meta_builds() - b_on, 1u);
  EXPECT_EQ(off.packed_meta_builds() - b_off, static_cast<uint64_t>(2 * c.num_hidden_layers));
  EXPECT_EQ(l_on, l_off);
  for (size_t i = 0; i < on.grads().size(); ++i) ASSERT_EQ(on.grads()[i], off.grads()[i]) << i;
}

// Switch activation_checkpointing (recompute part): checkpointing gives the same gradients, bit for bit.
TEST(Model, ActivationCheckpointingMatches) {
  for (int layers : {1, 3}) {
    ModelConfig c = tiny();
    c.num_hidden_layers = layers;
    Model plain = make(c);
    c.activation_checkpointing = true;
    Model ck = make(c);
    PackedBatch b = sample_batch(c.vocab_size);
    plain.zero_grads();
    ck.zero_grads();
    EXPECT_EQ(run_loss(plain, b, 1.0f, true), run_loss(ck, b, 1.0f, true));
    for (size_t i = 0; i < plain.grads().size(); ++i) ASSERT_EQ(plain.grads()[i], ck.grads()[i]) << i;
    if (layers > 1) {
      EXPECT_LT(ck.activation_peak_bytes(), plain.activation_peak_bytes());
    }
  }
}

// Switch moe_grouped from the model's side: grouped and masked MoE routing give the same gradients.
TEST(Model, MoeGroupedMatchesMasked) {
  ModelConfig c = tiny();
  Model g = make(c);
  c.moe_grouped = false;
  Model m = make(c);
  PackedBatch b = sample_batch(c.vocab_size);
  g.zero_grads();
  m.zero_grads();
  EXPECT_EQ(run_loss(g, b, 1.0f, true), run_loss(m, b, 1.0f, true));
  for (size_t i = 0; i < g.grads().size(); ++i) ASSERT_EQ(g.grads()[i], m.grads()[i]) << i;
}

// Sampled log-probs equal a full forward of prompt + completion at the same temperature.
TEST(Model, KvCacheLogprobsMatchForward) {
  for (const char* fam : kAllFamilies) {
    Model m = make(tiny_family(fam));
    std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {5}, {7, 8, 9, 10, 11, 12}};
    for (float temp : {1.0f, 0.7f, 0.0f}) {
      SamplingParams sp;
      sp.temperature = temp;
      sp.max_new_tokens = 9;
      sp.seed = 42;
      sp.top_k = temp == 0.7f ? 10 : 0;
      sp.top_p = temp == 0.7f ? 0.9f : 1.0f;
      auto gen = m.generate(prompts, sp);
      ASSERT_TRUE(gen.ok()) << gen.error().message;
      std::vector<std::vector<int32_t>> full;
      for (size_t i = 0; i < prompts.size(); ++i) {
        ASSERT_EQ(gen.value()[i].tokens.size(), 9u);
        EXPECT_FALSE(gen.value()[i].stopped);
        auto s = prompts[i];
        s.insert(s.end(), gen.value()[i].tokens.begin(), gen.value()[i].tokens.end());
        full.push_back(s);
      }
      PackedBatch b = batch_of(full);
      std::vector<float> lp(b.tokens.size()), ent(b.tokens.size());
      ASSERT_TRUE(m.forward_train(b, temp == 0.0f ? 1.0f : temp, lp.data(), ent.data()).ok());
      for (size_t i = 0; i < prompts.size(); ++i) {
        const size_t P = prompts[i].size();
        for (size_t j = 0; j < gen.value()[i].tokens.size(); ++j) {
          const size_t t = b.cu_seqlens[i] + P - 1 + j;  // position predicting generated token j
          EXPECT_NEAR(gen.value()[i].logprobs[j], lp[t], 1e-4) << fam << " temp " << temp << " seq " << i;
        }
      }
      if (temp == 0.0f) {  // greedy: each token is the argmax of the forward logits
        std::vector<float> lg(b.tokens.size() * m.config().vocab_size);
        ASSERT_TRUE(m.forward_logits(b, lg.data()).ok());
        const int V = m.config().vocab_size;
        for (size_t i = 0; i < prompts.size(); ++i)
          for (size_t j = 0; j < gen.value()[i].tokens.size(); ++j) {
            const size_t t = b.cu_seqlens[i] + prompts[i].size() - 1 + j;
            const float* row = lg.data() + t * V;
            EXPECT_EQ(gen.value()[i].tokens[j], std::max_element(row, row + V) - row);
          }
      }
    }
  }
}

TEST(Model, SamplingIsSeededAndStops) {
  Model m = make(tiny());
  std::vector<std::vector<int32_t>> prompts = {{1, 2}, {3, 4, 5}};
  SamplingParams sp;
  sp.max_new_tokens = 12;
  sp.seed = 9;
  auto a = m.generate(prompts, sp), b = m.generate(prompts, sp);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(a.value()[i].tokens, b.value()[i].tokens);
    EXPECT_EQ(a.value()[i].logprobs, b.value()[i].logprobs);
  }
  sp.seed = 10;
  auto c = m.generate(prompts, sp);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a.value()[0].tokens, c.value()[0].tokens);
  // Stop on the 3rd sampled token of prompt 0: it is included and the generation is marked stopped.
  sp.seed = 9;
  sp.stop_tokens = {a.value()[0].tokens[2]};
  auto s = m.generate(prompts, sp);
  ASSERT_TRUE(s.ok());
  const auto& g0 = s.value()[0];
  ASSERT_LE(g0.tokens.size(), 3u);
  EXPECT_TRUE(g0.stopped);
  EXPECT_EQ(g0.tokens.back(), a.value()[0].tokens[2]);
  // Bad sampling input is an error, not a crash.
  sp.top_p = 0.0f;
  EXPECT_FALSE(m.generate(prompts, sp).ok());
  sp.top_p = 1.0f;
  EXPECT_FALSE(m.generate({{}}, sp).ok());
  EXPECT_FALSE(m.generate({{1, 500}}, sp).ok());
}

// Switch offload_activations: checkpointing with offload + (double-buffered or synchronous) reload gives the
// plain path's gradients bit for bit, also when the copy engine is slowed by injected delays (a
// missing wait would read stale or torn layer inputs and change the gradients).
TEST(Model, ActivationOffloadMatches) {
  for (int layers : {1, 2, 5}) {
    for (bool dbl : {true, false}) {
      for (bool delays : {false, true}) {
        ModelConfig c = tiny();
        c.num_hidden_layers = layers;
        Model plain = make(c);
        c.activation_checkpointing = true;
        c.offload_activations = true;
        c.offload_double_buffer = dbl;
        Model off = make(c);
        ASSERT_NE(off.offload_engine(), nullptr);
        if (delays) off.offload_engine()->set_delay([](uint64_t i) { return 0.0005 * static_cast<double>(i % 3); });
        PackedBatch b = sample_batch(c.vocab_size);
        for (int step = 0; step < 2; ++step) {  // the second step reuses the store and buffers
          plain.zero_grads();
          off.zero_grads();
          ASSERT_EQ(run_loss(plain, b, 1.0f, true), run_loss(off, b, 1.0f, true));
          for (size_t i = 0; i < plain.grads().size(); ++i)
            ASSERT_EQ(plain.grads()[i], off.grads()[i]) << "layers " << layers << " double " << dbl << " i " << i;
        }
        const auto* st = off.activation_offload();
        ASSERT_NE(st, nullptr);
        if (layers > 2) {
          if (dbl) EXPECT_GT(st->overlapped_reloads(), 0);
          else EXPECT_GT(st->sync_reloads(), 0);
        }
      }
    }
  }
}

namespace {

// max |a - w| / max |w|
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& w) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - w[i]));
    den = std::max(den, std::fabs(double(w[i])));
  }
  return num / den;
}

// The sampler records, for every sampled token, the top-k experts of each MoE layer at the
// position whose output sampled it; the training forward records the same positions.
TEST(Model, RoutingRecordMatchesForward) {
  Model m = make(tiny());  // layer 0 dense, layers 1-2 MoE, top-2 of 4
  const int K = m.config().num_experts_per_tok, E = m.config().num_experts;
  ASSERT_EQ(m.routing_width(), 2 * K);
  std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {5}, {7, 8, 9, 10, 11, 12}};
  SamplingParams sp;
  sp.max_new_tokens = 7;
  sp.seed = 3;
  auto gen = m.generate(prompts, sp);
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  std::vector<std::vector<int32_t>> full;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& g = gen.value()[i];
    ASSERT_EQ(g.experts.size(), g.tokens.size() * static_cast<size_t>(m.routing_width()));
    for (size_t j = 0; j < g.experts.size(); j += K)
      for (int k = 0; k < K; ++k) {
        EXPECT_GE(g.experts[j + k], 0);
        EXPECT_LT(g.experts[j + k], E);
        if (k > 0) {
          EXPECT_LT(g.experts[j + k - 1], g.experts[j + k]);  // ascending within a layer
        }
      }
    auto s = prompts[i];
    s.insert(s.end(), g.tokens.begin(), g.tokens.end());
    full.push_back(s);
  }
  PackedBatch b = batch_of(full);
  std::vector<float> lp(b.tokens.size()), ent(b.tokens.size());
  ASSERT_TRUE(m.forward_train(b, 1.0f, lp.data(), ent.data()).ok());
  const auto routing = m.last_routing();
  ASSERT_EQ(routing.size(), b.tokens.size() * static_cast<size_t>(m.routing_width()));
  int pairs = 0, same = 0;
  const size_t W = static_cast<size_t>(m.routing_width());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& g = gen.value()[i];
    for (size_t j = 0; j < g.tokens.size(); ++j) {
      const size_t t = b.cu_seqlens[i] + prompts[i].size() - 1 + j;  // the position predicting token j
      for (size_t l = 0; l < W; l += K) {
        ++pairs;
        same += std::equal(routing.begin() + t * W + l, routing.begin() + t * W + l + K, g.experts.begin() + j * W + l);
      }
    }
  }
  // Decode and packed forward round differently, which may flip a near tie, but never often.
  EXPECT_GE(same, pairs * 9 / 10) << same << " of " << pairs;
  Model dense = make(tiny_family("llama"));
  EXPECT_EQ(dense.routing_width(), 0);
  auto dg = dense.generate(prompts, sp);
  ASSERT_TRUE(dg.ok());
  EXPECT_TRUE(dg.value()[0].experts.empty());
}

// policy.logprob_chunk: the LM head over vocabulary chunks equals the whole-vocabulary head (bit
// for bit with one chunk, to rounding with several) in log-probs, entropies, logits and gradients.
TEST(Model, ChunkedLogprobsMatchWholeVocabulary) {
  std::vector<std::vector<int32_t>> seqs = {{1, 2, 3, 4, 5, 6}, {7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17}};
  PackedBatch b = batch_of(seqs);
  const size_t T = b.tokens.size();
  struct Run {
    std::vector<float> lp, ent, grads, logits;
  };
  auto run = [&](int chunk) {
    ModelConfig c = tiny();
    c.logprob_chunk = chunk;
    Model m = make(c);
    Run r;
    r.lp.resize(T), r.ent.resize(T);
    std::vector<float> dlp(T, 0.3f), dent(T, -0.05f);
    EXPECT_TRUE(m.forward_train(b, 0.9f, r.lp.data(), r.ent.data()).ok());
    m.zero_grads();
    EXPECT_TRUE(m.backward_train(dlp.data(), dent.data()).ok());
    r.grads.assign(m.grads().begin(), m.grads().end());
    r.logits.resize(T * static_cast<size_t>(c.vocab_size));
    EXPECT_TRUE(m.forward_logits(b, r.logits.data()).ok());
    return r;
  };
  const Run whole = run(0);
  const Run one = run(37);  // the vocabulary is 37: one chunk
  EXPECT_EQ(one.lp, whole.lp);
  EXPECT_EQ(one.ent, whole.ent);
  EXPECT_EQ(one.grads, whole.grads);
  EXPECT_EQ(one.logits, whole.logits);
  const auto rel = max_rel_diff;
  for (int chunk : {5, 16}) {
    const Run c = run(chunk);
    EXPECT_LT(rel(c.lp, whole.lp), 1e-6) << chunk;
    EXPECT_LT(rel(c.ent, whole.ent), 1e-6) << chunk;
    EXPECT_LT(rel(c.grads, whole.grads), 1e-6) << chunk;
    EXPECT_LT(rel(c.logits, whole.logits), 1e-6) << chunk;
  }
}

// forward_backward_train: with several chunks the head runs once over row tiles and equals
// forward_train + grad + backward_train (and the whole vocabulary) to 1e-6 relative, for a grad that
// reads each row's log-prob and entropy; with one chunk it is those calls bit for bit. Checkpointing
// with offload gives its same bits, routing replay and the batch-invariant mode keep working (in
// that mode its log-probs are forward_train's bits).
TEST(Model, FusedHeadMatchesSeparateCalls) {
  std::vector<std::vector<int32_t>> seqs = {{1, 2, 3, 4, 5, 6}, {7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17}};
  const PackedBatch plain = batch_of(seqs);
  const size_t T = plain.tokens.size();
  struct Run {
    std::vector<float> lp, ent, grads;
    std::vector<std::pair<int, int>> tiles;
  };
  auto run = [&](const ModelConfig& c, bool fused, const PackedBatch& b) {
    Model m = make(c);
    Run r;
    r.lp.resize(T), r.ent.resize(T);
    std::vector<float> dlp(T, NAN), dent(T, NAN);
    auto grad = [&](int t0, int t1) {
      r.tiles.emplace_back(t0, t1);
      for (int t = t0; t < t1; ++t) dlp[t] = 0.3f + 0.2f * r.lp[t], dent[t] = -0.05f + 0.01f * r.ent[t];
    };
    m.zero_grads();
    if (fused) {
      EXPECT_TRUE(m.forward_backward_train(b, 0.9f, r.lp.data(), r.ent.data(), dlp.data(), dent.data(), grad).ok());
    } else {
      EXPECT_TRUE(m.forward_train(b, 0.9f, r.lp.data(), r.ent.data()).ok());
      grad(0, static_cast<int>(T));
      EXPECT_TRUE(m.backward_train(dlp.data(), dent.data()).ok());
    }
    r.grads.assign(m.grads().begin(), m.grads().end());
    return r;
  };
  const auto rel = max_rel_diff;
  auto with_chunk = [](int chunk) {
    ModelConfig c = tiny();
    c.logprob_chunk = chunk;
    return c;
  };
  const Run whole = run(with_chunk(0), false, plain);
  const Run one = run(with_chunk(37), true, plain);  // one chunk: the separate calls
  EXPECT_EQ(one.tiles, (std::vector<std::pair<int, int>>{{0, 17}}));
  EXPECT_EQ(one.lp, whole.lp);
  EXPECT_EQ(one.ent, whole.ent);
  EXPECT_EQ(one.grads, whole.grads);
  for (int chunk : {5, 16}) {  // max(17 * 5 / 37, 17 / 4) = 4 and 17 * 16 / 37 = 7 rows a tile
    const Run f = run(with_chunk(chunk), true, plain);
    const Run sep = run(with_chunk(chunk), false, plain);
    EXPECT_EQ(f.tiles.size(), chunk == 5 ? 5u : 3u) << chunk;
    EXPECT_LT(rel(f.lp, whole.lp), 1e-6) << chunk;
    EXPECT_LT(rel(f.ent, whole.ent), 1e-6) << chunk;
    EXPECT_LT(rel(f.grads, whole.grads), 1e-6) << chunk;
    EXPECT_LT(rel(f.grads, sep.grads), 1e-6) << chunk;
  }
  const Run f5 = run(with_chunk(5), true, plain);
  ModelConfig ck = with_chunk(5);
  ck.activation_checkpointing = true;
  ck.offload_activations = true;
  const Run ckpt = run(ck, true, plain);
  EXPECT_EQ(ckpt.lp, f5.lp);
  EXPECT_EQ(ckpt.grads, f5.grads);
  // Routing replay of a record (the model's own routing with one position's experts moved).
  PackedBatch replayed = plain;
  {
    Model m = make(with_chunk(5));
    std::vector<float> lp(T), ent(T);
    ASSERT_TRUE(m.forward_train(plain, 0.9f, lp.data(), ent.data()).ok());
    replayed.experts.assign(m.last_routing().begin(), m.last_routing().end());
    const int K = tiny().num_experts_per_tok;
    std::vector<int32_t> moved;  // position 3, first MoE layer: experts the router did not pick
    for (int e = 0; e < tiny().num_experts && static_cast<int>(moved.size()) < K; ++e)
      if (std::find(replayed.experts.begin() + 3 * m.routing_width(),
                    replayed.experts.begin() + 3 * m.routing_width() + K, e) ==
          replayed.experts.begin() + 3 * m.routing_width() + K)
        moved.push_back(e);
    std::copy(moved.begin(), moved.end(), replayed.experts.begin() + 3 * m.routing_width());
  }
  ModelConfig rc = with_chunk(5);
  rc.routing_replay = RoutingReplay::rollout;
  const Run rf = run(rc, true, replayed), rs = run(rc, false, replayed);
  EXPECT_LT(rel(rf.grads, rs.grads), 1e-6);
  EXPECT_GT(rel(rf.grads, f5.grads), 1e-4) << "the replayed record must change the gradients";
  ModelConfig bi = with_chunk(5);
  bi.batch_invariant = true;
  const Run bf = run(bi, true, plain), bs = run(bi, false, plain);
  EXPECT_EQ(bf.lp, bs.lp);
  EXPECT_EQ(bf.ent, bs.ent);
  EXPECT_LT(rel(bf.grads, bs.grads), 1e-6);
}

}  // namespace

namespace {

// The expert record of a packed batch built from prompts + generations: the position predicting
// completion token j carries that token's record, every other position -1 (router's own top-k).
std::vector<int32_t> replay_record(const PackedBatch& b, const std::vector<std::vector<int32_t>>& prompts,
                                   const std::vector<Generation>& gens, int W) {
  std::vector<int32_t> rec(b.tokens.size() * static_cast<size_t>(W), -1);
  for (size_t i = 0; i < prompts.size(); ++i)
    for (size_t j = 0; j < gens[i].tokens.size(); ++j) {
      const size_t t = b.cu_seqlens[i] + prompts[i].size() - 1 + j;
      std::copy_n(gens[i].experts.begin() + static_cast<std::ptrdiff_t>(j * W), W,
                  rec.begin() + static_cast<std::ptrdiff_t>(t * W));
    }
  return rec;
}

// (pairs compared, pairs whose top-k sets agree) of a record against the model's last routing.
std::pair<int, int> agreement(const std::vector<int32_t>& rec, std::span<const int32_t> routing, int W, int K) {
  int pairs = 0, same = 0;
  for (size_t t = 0; t * W < rec.size(); ++t)
    for (int l = 0; l < W; l += K) {
      const size_t at = t * W + static_cast<size_t>(l);
      if (rec[at] < 0) continue;
      ++pairs;
      same += std::equal(rec.begin() + static_cast<std::ptrdiff_t>(at), rec.begin() + static_cast<std::ptrdiff_t>(at + K),
                         routing.begin() + static_cast<std::ptrdiff_t>(at));
    }
  return {pairs, same};
}

}  // namespace

// Routing replay: a learner whose weights differ from the sampler's (another policy version) routes
// differently on its own; replaying the sampler's record makes every recorded (token, layer) agree.
TEST(Model, RoutingReplayAgreesWithTheSampler) {
  ModelConfig c = tiny();
  Model sampler = make(c);
  const int K = c.num_experts_per_tok, W = sampler.routing_width();
  std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {5}, {7, 8, 9, 10, 11, 12}, {4, 4}};
  SamplingParams sp;
  sp.max_new_tokens = 9;
  sp.seed = 5;
  auto gen = sampler.generate(prompts, sp);
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  std::vector<std::vector<int32_t>> full;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = prompts[i];
    s.insert(s.end(), gen.value()[i].tokens.begin(), gen.value()[i].tokens.end());
    full.push_back(s);
  }
  PackedBatch b = batch_of(full);
  const auto rec = replay_record(b, prompts, gen.value(), W);
  b.experts = rec;
  // The learner: the sampler's weights with the routers moved (a later policy version).
  std::vector<float> params(sampler.params().begin(), sampler.params().end());
  std::mt19937 g(9);
  std::normal_distribution<float> d(0.0f, 0.5f);
  for (const auto& t : sampler.tensors())
    if (t.name.find("mlp.gate.weight") != std::string::npos)
      for (size_t i = 0; i < t.numel(); ++i) params[t.offset + i] += d(g);
  std::vector<float> lp(b.tokens.size()), ent(b.tokens.size());
  for (bool replay : {false, true}) {
    ModelConfig lc = c;
    lc.routing_replay = replay ? RoutingReplay::rollout : RoutingReplay::off;
    Model learner = make(lc);
    ASSERT_TRUE(learner.set_params(params).ok());
    ASSERT_TRUE(learner.forward_train(b, 1.0f, lp.data(), ent.data()).ok());
    const auto [pairs, same] = agreement(rec, learner.last_routing(), W, K);
    ASSERT_GT(pairs, 40);
    if (replay) {
      EXPECT_EQ(same, pairs);  // by construction
    } else {
      EXPECT_LT(same, pairs);  // the metric sees the learner's own routing differ
    }
    // Positions without a record route by the learner's own top-k in both modes.
  }
  // The sampler's own record replayed on the sampler's weights leaves the log-probs where the
  // routes already agreed.
  ModelConfig rc = c;
  rc.routing_replay = RoutingReplay::rollout;
  Model same_weights = make(rc);
  ASSERT_TRUE(same_weights.set_params(std::span<const float>(sampler.params().data(), sampler.params().size())).ok());
  ASSERT_TRUE(same_weights.forward_train(b, 1.0f, lp.data(), ent.data()).ok());
  const auto [pairs, same] = agreement(rec, same_weights.last_routing(), W, K);
  EXPECT_EQ(same, pairs);
}

TEST(Model, RoutingReplayBadRecordsAreErrors) {
  ModelConfig c = tiny();
  c.routing_replay = RoutingReplay::rollout;
  Model m = make(c);
  const int W = m.routing_width();
  PackedBatch b = sample_batch(c.vocab_size);
  std::vector<float> lp(b.tokens.size());
  b.experts.assign(b.tokens.size() * W - 1, -1);
  auto st = m.forward_train(b, 1.0f, lp.data(), nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("routing width"), std::string::npos) << st.error().message;
  b.experts.assign(b.tokens.size() * W, -1);
  b.experts[W + 2] = 1, b.experts[W + 3] = 1;  // token 1, MoE layer 1: the same expert twice
  st = m.forward_train(b, 1.0f, lp.data(), nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("token 1, MoE layer 1"), std::string::npos) << st.error().message;
  b.experts[W + 2] = 0, b.experts[W + 3] = c.num_experts;  // outside [0, E)
  EXPECT_FALSE(m.forward_train(b, 1.0f, lp.data(), nullptr).ok());
  b.experts[W + 3] = 3;
  EXPECT_TRUE(m.forward_train(b, 1.0f, lp.data(), nullptr).ok());
  ModelConfig dense = tiny_family("llama");
  dense.routing_replay = RoutingReplay::rollout;
  auto bad = Model::create(dense, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("routing_replay"), std::string::npos) << bad.error().message;
}

// Replayed routing is differentiated as it was taken: gradients (router included, through the
// gates over the recorded set) against central finite differences, and the same under
// activation checkpointing (whose recompute must replay too).
TEST(Model, RoutingReplayFiniteDifferenceGradients) {
  for (const char* fam : {"qwen3_moe", "mixtral", "qwen2_moe"}) {
    ModelConfig c = tiny_family(fam);
    c.routing_replay = RoutingReplay::rollout;
    Model m = make(c);
    PackedBatch b = sample_batch(c.vocab_size);
    const int W = m.routing_width(), K = c.num_experts_per_tok, E = c.num_experts;
    std::mt19937 r(21);
    b.experts.assign(b.tokens.size() * W, -1);
    for (size_t t = 0; t < b.tokens.size(); ++t)
      for (int l = 0; l < W; l += K) {
        if (t % 7 == 3) continue;  // a few positions keep their own routing
        const int e0 = static_cast<int>(r() % E), e1 = (e0 + 1 + static_cast<int>(r() % (E - 1))) % E;
        b.experts[t * W + l] = e0, b.experts[t * W + l + 1] = e1;
      }
    m.zero_grads();
    run_loss(m, b, 0.9f, true);
    std::vector<float> g(m.grads().begin(), m.grads().end());
    int checked = 0;
    for (const auto& t : m.tensors()) {
      for (int rep = 0; rep < 2; ++rep) {
        const size_t i = t.offset + r() % t.numel();
        float& p = m.params()[i];
        const float orig = p, h = 1e-3f;
        p = orig + h;
        const double lp = run_loss(m, b, 0.9f, false);
        p = orig - h;
        const double lm = run_loss(m, b, 0.9f, false);
        p = orig;
        const double num = (lp - lm) / (2 * h);
        EXPECT_NEAR(g[i], num, 2e-3 + 2e-2 * std::fabs(num)) << fam << " " << t.name << " [" << i - t.offset << "]";
        ++checked;
      }
    }
    EXPECT_GT(checked, 40);
    // The replayed routing differs from the router's own: the gradients are not the unreplayed ones.
    ModelConfig off = c;
    off.routing_replay = RoutingReplay::off;
    Model plain = make(off);
    plain.zero_grads();
    run_loss(plain, b, 0.9f, true);
    double diff = 0;
    for (size_t i = 0; i < g.size(); ++i) diff += std::fabs(plain.grads()[i] - g[i]);
    EXPECT_GT(diff, 1e-3) << fam;
    ModelConfig ck = c;
    ck.activation_checkpointing = true;
    Model ckm = make(ck);
    ckm.zero_grads();
    run_loss(ckm, b, 0.9f, true);
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(ckm.grads()[i], g[i]) << fam << " " << i;
  }
}

// The KV-cache sampler over vocabulary chunks (policy.logprob_chunk < V) draws what the
// whole-vocabulary sampler draws: the same tokens, log-probs to rounding, for each sampling mode.
TEST(Model, ChunkedSamplingMatchesWholeVocabulary) {
  ModelConfig c = tiny();
  c.vocab_size = 300;
  c.logprob_chunk = 64;
  Model chunked = make(c);
  ModelConfig w = c;
  w.logprob_chunk = 0;
  Model whole = make(w);
  std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {5}, {7, 8, 9, 10}};
  const struct {
    float temperature;
    int top_k;
    float top_p;
  } modes[] = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.8f, 7, 1.0f}, {1.0f, 10, 0.7f}, {1.0f, 0, 0.8f}};
  for (const auto& mode : modes) {
    SamplingParams sp;
    sp.temperature = mode.temperature, sp.top_k = mode.top_k, sp.top_p = mode.top_p;
    sp.max_new_tokens = 8;
    sp.seed = 17;
    auto a = chunked.generate(prompts, sp);
    auto b = whole.generate(prompts, sp);
    ASSERT_TRUE(a.ok() && b.ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(a.value()[i].tokens, b.value()[i].tokens) << sp.temperature << " " << sp.top_k << " " << sp.top_p;
      ASSERT_EQ(a.value()[i].logprobs.size(), b.value()[i].logprobs.size());
      for (size_t j = 0; j < a.value()[i].logprobs.size(); ++j)
        EXPECT_NEAR(a.value()[i].logprobs[j], b.value()[i].logprobs[j], 1e-5);
    }
  }
}

// policy.batch_invariant: the KV-cache sampler's log-probs and MoE routes equal the packed
// training forward's bit for bit (every family; plain temperature, top-k, greedy; a chunked head),
// and a sequence's log-probs do not depend on the other sequences of its batch.
TEST(Model, BatchInvariantSamplerEqualsLearner) {
  for (const char* fam : kAllFamilies) {
    for (int chunk : {4096, 16}) {
      ModelConfig c = tiny_family(fam);
      c.batch_invariant = true;
      c.logprob_chunk = chunk;
      Model m = make(c);
      std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {5}, {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, {4, 4}};
      for (const float temp : {1.0f, 0.7f}) {
        SamplingParams sp;
        sp.temperature = temp;
        sp.top_k = temp < 1.0f ? 5 : 0;
        sp.max_new_tokens = 12;
        sp.seed = 31;
        auto gen = m.generate(prompts, sp);
        ASSERT_TRUE(gen.ok()) << gen.error().message;
        std::vector<std::vector<int32_t>> full;
        for (size_t i = 0; i < prompts.size(); ++i) {
          auto s = prompts[i];
          s.insert(s.end(), gen.value()[i].tokens.begin(), gen.value()[i].tokens.end());
          full.push_back(s);
        }
        PackedBatch b = batch_of(full);
        std::vector<float> lp(b.tokens.size()), ent(b.tokens.size());
        ASSERT_TRUE(m.forward_train(b, temp, lp.data(), ent.data()).ok());
        const int W = m.routing_width();
        const auto routing = m.last_routing();
        for (size_t i = 0; i < prompts.size(); ++i) {
          const auto& g = gen.value()[i];
          for (size_t j = 0; j < g.tokens.size(); ++j) {
            const size_t t = b.cu_seqlens[i] + prompts[i].size() - 1 + j;
            ASSERT_EQ(g.logprobs[j], lp[t]) << fam << " chunk " << chunk << " temp " << temp << " seq " << i
                                            << " token " << j;
            for (int w = 0; w < W; ++w)
              ASSERT_EQ(g.experts[j * W + w], routing[t * W + w]) << fam << " seq " << i << " token " << j;
          }
        }
        // One sequence alone: the same bits as inside the batch.
        PackedBatch one = batch_of({full[2]});
        std::vector<float> lp1(one.tokens.size());
        ASSERT_TRUE(m.forward_train(one, temp, lp1.data(), nullptr).ok());
        for (size_t t = 0; t < one.tokens.size(); ++t) ASSERT_EQ(lp1[t], lp[b.cu_seqlens[2] + t]) << fam << " " << t;
      }
    }
  }
}

// Greedy sampling reports the log-prob at temperature 1, and the gradients of the invariant
// forward are its gradients (finite differences), also under activation checkpointing.
TEST(Model, BatchInvariantGreedyAndGradients) {
  ModelConfig c = tiny();
  c.batch_invariant = true;
  Model m = make(c);
  std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {6, 7}};
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_new_tokens = 6;
  auto gen = m.generate(prompts, sp);
  ASSERT_TRUE(gen.ok());
  std::vector<std::vector<int32_t>> full;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = prompts[i];
    s.insert(s.end(), gen.value()[i].tokens.begin(), gen.value()[i].tokens.end());
    full.push_back(s);
  }
  PackedBatch b = batch_of(full);
  std::vector<float> lp(b.tokens.size());
  ASSERT_TRUE(m.forward_train(b, 1.0f, lp.data(), nullptr).ok());
  for (size_t i = 0; i < prompts.size(); ++i)
    for (size_t j = 0; j < gen.value()[i].tokens.size(); ++j)
      ASSERT_EQ(gen.value()[i].logprobs[j], lp[b.cu_seqlens[i] + prompts[i].size() - 1 + j]);
  PackedBatch sb = sample_batch(c.vocab_size);
  m.zero_grads();
  run_loss(m, sb, 0.9f, true);
  std::vector<float> g(m.grads().begin(), m.grads().end());
  std::mt19937 r(5);
  for (const auto& t : m.tensors()) {
    const size_t i = t.offset + r() % t.numel();
    float& p = m.params()[i];
    const float orig = p, h = 1e-3f;
    p = orig + h;
    const double lp1 = run_loss(m, sb, 0.9f, false);
    p = orig - h;
    const double lm1 = run_loss(m, sb, 0.9f, false);
    p = orig;
    const double num = (lp1 - lm1) / (2 * h);
    EXPECT_NEAR(g[i], num, 2e-3 + 2e-2 * std::fabs(num)) << t.name;
  }
  ModelConfig ck = c;
  ck.activation_checkpointing = true;
  Model ckm = make(ck);
  ckm.zero_grads();
  run_loss(ckm, sb, 0.9f, true);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(ckm.grads()[i], g[i]) << i;
}

// SamplingParams::streams: a prompt's draws follow its stream, not its index, so with batch
// invariance a prompt sampled alone equals itself sampled among others (what lets a step's samples
// be spread over any number of generators); a wrong count or a negative stream is an error.
TEST(Model, BatchInvariantStreamsIndependentOfTheBatch) {
  ModelConfig c = tiny();
  c.batch_invariant = true;
  Model m = make(c);
  SamplingParams sp;
  sp.max_new_tokens = 10;
  sp.seed = 77;
  sp.streams = {4, 9, 2};
  auto all = m.generate({{1, 2, 3}, {6, 7}, {9, 9, 9, 9}}, sp);
  ASSERT_TRUE(all.ok());
  sp.streams = {9};
  auto one = m.generate({{6, 7}}, sp);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one.value()[0].tokens, all.value()[1].tokens);
  EXPECT_EQ(one.value()[0].logprobs, all.value()[1].logprobs);
  EXPECT_EQ(one.value()[0].experts, all.value()[1].experts);
  sp.streams = {9, 1};
  EXPECT_FALSE(m.generate({{6, 7}}, sp).ok());
  sp.streams = {-1};
  EXPECT_FALSE(m.generate({{6, 7}}, sp).ok());
}
