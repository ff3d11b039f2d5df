// DecodeSlots (continuous batching): a sequence alone samples exactly what Model::generate samples
// (tokens and log-probs, same seed and stream); sequences joining and leaving between steps sample
// what each samples alone; a constrained sequence draws only allowed tokens and leaves the others'
// draws unchanged; top log-probs are the log-softmax's best; bad input is an error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "test_models.h"
#include "troupe/policy/decode_slots.h"
#include "troupe/policy/model.h"

using namespace troupe::policy;

namespace {

Model make_model(const std::string& family, int vocab = 37, int logprob_chunk = 4096) {
  ModelConfig c;
  c.family = *troupe::enum_from_name<ModelFamily>(family);
  c.vocab_size = vocab;
  c.logprob_chunk = logprob_chunk;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 24;
  if (family == "qwen3_moe") {
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 12;
    c.mlp_only_layers = {0};
  } else {
    c.num_experts = 0;
  }
  return test::make(c, 5);
}

// Runs the slot sampler until `n` tokens per sequence; sequence i joins at step join[i].
std::vector<Generation> run_slots(Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                  const std::vector<SlotSampling>& sp, const std::vector<int>& join, int n) {
  auto slots = DecodeSlots::create(m, 4, 64);
  EXPECT_TRUE(slots.ok());
  std::vector<Generation> out(prompts.size());
  std::vector<int> slot_of(prompts.size(), -1);
  std::vector<int> seq_of(4, -1);
  size_t done = 0;
  for (int step = 0; done < prompts.size() && step < 1000; ++step) {
    for (size_t i = 0; i < prompts.size(); ++i)
      if (join[i] == step) {
        auto s = (*slots)->add(prompts[i], sp[i]);
        EXPECT_TRUE(s.ok());
        slot_of[i] = *s;
        seq_of[*s] = static_cast<int>(i);
      }
    auto toks = (*slots)->step();
    EXPECT_TRUE(toks.ok());
    for (const auto& t : *toks) {
      const int i = seq_of[t.slot];
      out[i].tokens.push_back(t.token);
      out[i].logprobs.push_back(t.logprob);
      if (static_cast<int>(out[i].tokens.size()) == n) {
        (*slots)->remove(t.slot);
        seq_of[t.slot] = -1;
        ++done;
      }
    }
  }
  EXPECT_EQ(done, prompts.size());
  return out;
}

}  // namespace

TEST(DecodeSlots, AloneMatchesGenerateBitForBit) {
  for (const char* fam : {"qwen3", "qwen3_moe", "llama"}) {
    Model m = make_model(fam);
    for (float temp : {0.0f, 1.0f, 0.7f}) {
      SamplingParams gp;
      gp.temperature = temp;
      gp.top_k = temp == 0.7f ? 8 : 0;
      gp.top_p = temp == 0.7f ? 0.9f : 1.0f;
      gp.max_new_tokens = 10;
      gp.seed = 123;
      const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
      auto gen = m.generate({prompt}, gp);
      ASSERT_TRUE(gen.ok());
      SlotSampling sp{temp, gp.top_k, gp.top_p, 123, 0, 0};
      auto got = run_slots(m, {prompt}, {sp}, {0}, 10);
      EXPECT_EQ(got[0].tokens, (*gen)[0].tokens) << fam << " temp " << temp;
      EXPECT_EQ(got[0].logprobs, (*gen)[0].logprobs) << fam << " temp " << temp;
    }
  }
}

TEST(DecodeSlots, JoiningAndLeavingSequencesSampleWhatTheyWouldAlone) {
  Model m = make_model("qwen3");
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {9}, {4, 5, 6, 7, 8, 9, 10}, {11, 12}, {13, 14, 15}};
  std::vector<SlotSampling> sp;
  for (int i = 0; i < 5; ++i) sp.push_back(SlotSampling{i % 2 ? 1.0f : 0.0f, 0, 1.0f, 77, i, 0, nullptr});
  // Five sequences over four slots, joining at different steps (the last waits for a free slot).
  auto together = run_slots(m, prompts, sp, {0, 0, 2, 3, 12}, 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = run_slots(m, {prompts[i]}, {sp[i]}, {0}, 12);
    EXPECT_EQ(together[i].tokens, alone[0].tokens) << "sequence " << i;
    for (size_t j = 0; j < alone[0].logprobs.size(); ++j)
      EXPECT_NEAR(together[i].logprobs[j], alone[0].logprobs[j], 1e-4) << "sequence " << i << " token " << j;
  }
}

namespace {
// Allows only the tokens v with v % 3 == 0, and records what it was told.
class EveryThird : public TokenConstraint {
 public:
  void mask(float* logits, int vocab) override {
    for (int v = 0; v < vocab; ++v)
      if (v % 3 != 0) logits[v] = -INFINITY;
  }
  void accept(int32_t token) override { accepted.push_back(token); }
  std::vector<int32_t> accepted;
};
}  // namespace

TEST(DecodeSlots, ConstrainedSequencesDrawOnlyAllowedTokensAndLeaveTheOthersAlone) {
  Model m = make_model("qwen3");
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {9, 4}, {5}};
  for (float temp : {0.0f, 1.0f}) {
    auto c = std::make_shared<EveryThird>();
    std::vector<SlotSampling> sp;
    for (int i = 0; i < 3; ++i) sp.push_back(SlotSampling{temp, 0, 1.0f, 5, i, 0, i == 1 ? c : nullptr});
    auto together = run_slots(m, prompts, sp, {0, 0, 1}, 10);
    for (int32_t t : together[1].tokens) EXPECT_EQ(t % 3, 0) << "temp " << temp;
    EXPECT_EQ(c->accepted, together[1].tokens);
    for (float lp : together[1].logprobs) EXPECT_LE(lp, 0.0f);
    for (size_t i : {0u, 2u}) {  // the unconstrained sequences sample what they sample alone
      auto alone = run_slots(m, {prompts[i]}, {sp[i]}, {0}, 10);
      EXPECT_EQ(together[i].tokens, alone[0].tokens) << "sequence " << i << " temp " << temp;
    }
  }
}

TEST(DecodeSlots, TopLogprobsAndErrors) {
  Model m = make_model("qwen3");
  auto slots = DecodeSlots::create(m, 2, 8);
  ASSERT_TRUE(slots.ok());
  DecodeSlots& s = **slots;
  SlotSampling sp;
  sp.temperature = 0.0f;
  sp.top_logprobs = 5;
  auto a = s.add({1, 2, 3}, sp);
  ASSERT_TRUE(a.ok());
  auto t = s.step();
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->size(), 1u);
  const SlotToken& tok = (*t)[0];
  ASSERT_EQ(tok.top.size(), 5u);
  EXPECT_EQ(tok.top[0].first, tok.token);  // greedy: the best token
  EXPECT_NEAR(tok.top[0].second, tok.logprob, 1e-5);
  for (size_t i = 1; i < tok.top.size(); ++i) EXPECT_GE(tok.top[i - 1].second, tok.top[i].second);
  EXPECT_EQ(s.room(*a), 8 - 3 - 1);
  // Until the context is full; then the sequence is not run any more.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.step().ok());
  EXPECT_EQ(s.room(*a), 0);
  auto none = s.step();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // Bad prompts and parameters are errors; a full set of slots refuses more.
  EXPECT_FALSE(s.add({}, sp).ok());
  EXPECT_FALSE(s.add({1, 2, 3, 4, 5, 6, 7, 8}, sp).ok());  // no room for a new token
  EXPECT_FALSE(s.add({1, 99}, sp).ok());
  SlotSampling bad = sp;
  bad.top_p = 0;
  EXPECT_FALSE(s.add({1}, bad).ok());
  ASSERT_TRUE(s.add({1}, sp).ok());
  EXPECT_EQ(s.free_slots(), 0);
  EXPECT_FALSE(s.add({1}, sp).ok());
  s.remove(*a);
  EXPECT_EQ(s.free_slots(), 1);
}

// A vocabulary of several policy.logprob_chunk chunks: the slots sample over chunks as generate
// does (the same tokens and log-prob bits for a sequence alone), and top log-probs come from a
// one-row logits buffer.
TEST(DecodeSlots, ChunkedVocabularyMatchesGenerate) {
  Model m = make_model("qwen3_moe", 300, 64);
  for (float temp : {0.0f, 1.0f, 0.7f}) {
    SamplingParams gp;
    gp.temperature = temp;
    gp.top_k = temp == 0.7f ? 8 : 0;
    gp.top_p = temp == 0.7f ? 0.9f : 1.0f;
    gp.max_new_tokens = 10;
    gp.seed = 99;
    const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
    auto gen = m.generate({prompt}, gp);
    ASSERT_TRUE(gen.ok());
    SlotSampling sp{temp, gp.top_k, gp.top_p, 99, 0, 0};
    auto got = run_slots(m, {prompt}, {sp}, {0}, 10);
    EXPECT_EQ(got[0].tokens, (*gen)[0].tokens) << "temp " << temp;
    EXPECT_EQ(got[0].logprobs, (*gen)[0].logprobs) << "temp " << temp;
  }
  auto slots = DecodeSlots::create(m, 2, 16);
  ASSERT_TRUE(slots.ok());
  SlotSampling sp;
  sp.temperature = 0.0f;
  sp.top_logprobs = 4;
  ASSERT_TRUE((*slots)->add({1, 2, 3}, sp).ok());
  ASSERT_TRUE((*slots)->add({7, 8}, SlotSampling{}).ok());
  auto t = (*slots)->step();
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->size(), 2u);
  const SlotToken& tok = (*t)[0];
  ASSERT_EQ(tok.top.size(), 4u);
  EXPECT_EQ(tok.top[0].first, tok.token);
  EXPECT_NEAR(tok.top[0].second, tok.logprob, 1e-5);
  EXPECT_TRUE((*t)[1].top.empty());
}

namespace {
// A random adapter of rank r on `modules` (Hugging Face weight names of m), as served adapter weights.
ServedAdapterWeights random_adapter(const Model& m, const std::vector<std::string>& weights, int r, float scale,
                                    uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  ServedAdapterWeights w;
  w.rank = r;
  w.scale = scale;
  for (const auto& name : weights) {
    const TensorSpec* t = m.find_base_tensor(name);
    ServedAdapterWeights::Pair p{name, std::vector<float>(r * t->shape[1]), std::vector<float>(t->shape[0] * r)};
    for (auto& x : p.a) x = u(rng);
    for (auto& x : p.b) x = u(rng);
    w.pairs.push_back(std::move(p));
  }
  return w;
}

// The same adapter as the model's own LoRA (enable_lora over `kinds`; modules it leaves alone A = B = 0).
Model with_own_lora(const ServedAdapterWeights& w, std::vector<LoraTarget> kinds, float alpha) {
  Model m = make_model("qwen3");
  LoraConfig lc;
  lc.rank = w.rank;
  lc.alpha = alpha;
  lc.targets = std::move(kinds);
  EXPECT_TRUE(m.enable_lora(lc, 0).ok());
  std::vector<float> values(m.params().size(), 0.0f);
  for (const auto& p : w.pairs) {
    const std::string mod = p.weight.substr(0, p.weight.size() - 7);  // minus ".weight"
    for (const auto& t : m.tensors()) {
      if (t.name == "base_model.model." + mod + ".lora_A.weight") std::copy(p.a.begin(), p.a.end(), values.begin() + t.offset);
      if (t.name == "base_model.model." + mod + ".lora_B.weight") std::copy(p.b.begin(), p.b.end(), values.begin() + t.offset);
    }
  }
  EXPECT_TRUE(m.set_params(values).ok());
  return m;
}
}  // namespace

TEST(DecodeSlots, ServedAdaptersSampleWhatEachAdapterSamplesAsTheModelsOwnLora) {
  Model m = make_model("qwen3");
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  std::vector<std::string> all;
  for (const auto& l : {l0, l1})
    for (const char* w : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                          "mlp.up_proj", "mlp.down_proj"})
      all.push_back(l + w + ".weight");
  const auto x = random_adapter(m, all, 2, 8.0f / 2, 1);
  const auto y = random_adapter(m, {l0 + "self_attn.q_proj.weight", l1 + "mlp.down_proj.weight"}, 3, 6.0f / 3, 2);
  ASSERT_EQ(*m.add_served_adapter(x), 1);
  ASSERT_EQ(*m.add_served_adapter(y), 2);
  EXPECT_EQ(m.served_adapters(), 2);
  Model own_x = with_own_lora(x, {LoraTarget::all_linear}, 8.0f);
  Model own_y = with_own_lora(y, {LoraTarget::q, LoraTarget::down}, 6.0f);
  Model* own[] = {nullptr, &own_x, &own_y};
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {9}, {4, 5, 6, 7, 8}, {11, 12}, {13, 14, 15}, {2, 2}};
  std::vector<SlotSampling> sp;
  for (int i = 0; i < 6; ++i) {
    sp.push_back(SlotSampling{i % 2 ? 1.0f : 0.0f, 0, 1.0f, 77, i, 0, nullptr});
    sp.back().adapter = (i * 2) % 3;  // 0 2 1 0 2 1: mixed in every step
  }
  auto together = run_slots(m, prompts, sp, {0, 0, 1, 2, 10, 11}, 10);  // 4 slots: the last two wait
  Model base = make_model("qwen3");
  bool differs = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SlotSampling alone_sp = sp[i];
    alone_sp.adapter = 0;
    Model& ref = own[sp[i].adapter] ? *own[sp[i].adapter] : base;
    auto alone = run_slots(ref, {prompts[i]}, {alone_sp}, {0}, 10);
    EXPECT_EQ(together[i].tokens, alone[0].tokens) << "sequence " << i << " adapter " << sp[i].adapter;
    for (size_t j = 0; j < alone[0].logprobs.size(); ++j)
      EXPECT_NEAR(together[i].logprobs[j], alone[0].logprobs[j], 1e-4) << "sequence " << i << " token " << j;
    auto plain = run_slots(base, {prompts[i]}, {alone_sp}, {0}, 10);
    differs = differs || (sp[i].adapter != 0 && plain[0].logprobs != alone[0].logprobs);
  }
  EXPECT_TRUE(differs) << "the adapters change nothing";
  // A sequence alone with its served adapter: bit for bit the model's own LoRA path.
  SlotSampling s1 = sp[0];
  s1.adapter = 1;
  auto served = run_slots(m, {prompts[2]}, {s1}, {0}, 10);
  s1.adapter = 0;
  auto ref = run_slots(own_x, {prompts[2]}, {s1}, {0}, 10);
  EXPECT_EQ(served[0].tokens, ref[0].tokens);
  EXPECT_EQ(served[0].logprobs, ref[0].logprobs);
}

TEST(DecodeSlots, ServedAdapterErrors) {
  Model m = make_model("qwen3");
  auto bad = random_adapter(m, {"model.layers.0.self_attn.q_proj.weight"}, 2, 1.0f, 3);
  bad.pairs[0].weight = "model.embed_tokens.weight";
  auto r = m.add_served_adapter(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("model.embed_tokens.weight"), std::string::npos) << r.error().message;
  auto big = random_adapter(m, {"model.layers.0.self_attn.k_proj.weight"}, 17, 1.0f, 4);  // k_proj is (16, 16)
  r = m.add_served_adapter(big);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("exceeds min(in, out) = 16"), std::string::npos) << r.error().message;
  auto slots = DecodeSlots::create(m, 2, 8);
  ASSERT_TRUE(slots.ok());
  SlotSampling sp;
  sp.adapter = 1;  // none added
  auto a = (*slots)->add({1, 2}, sp);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("adapter 1"), std::string::npos) << a.error().message;
}
