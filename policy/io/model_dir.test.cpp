// policy.model_dir: transformers-made directories of both families load as is in both expert
// layouts (tests/hf_fixture), config.json maps to ModelConfig, our saves use exactly the tensor
// names transformers writes, and every bad directory gives an error naming the file.
#include "troupe/policy/io/model_dir.h"

#include <gtest/gtest.h>

#include "test_temp_dir.h"

#include <filesystem>
#include <fstream>

#include "troupe/base/build_config.h"

namespace fs = std::filesystem;
using namespace troupe::policy::io;
using nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) { return troupe::policy::io::testing::make_temp_dir("modeldir", name); }

fs::path fixture(const std::string& sub) { return fs::path(TROUPE_SOURCE_DIR) / "tests" / "hf_fixture" / sub; }

std::vector<std::string> file_names(const fs::path& p) {
  auto f = SafetensorsFile::open(p.string());
  EXPECT_TRUE(f.ok()) << f.error().message;
  std::vector<std::string> n;
  for (const auto& e : f->entries()) n.push_back(e.name);
  std::sort(n.begin(), n.end());
  return n;
}

void expect_same_tensors(const TensorMap& a, const TensorMap& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(t.shape, b.at(name).shape) << name;
    EXPECT_EQ(t.data, b.at(name).data) << name;
  }
}

// A copy of a fixture directory that a test may break.
fs::path copy_fixture(const std::string& sub, const std::string& name) {
  auto d = temp_dir(name);
  fs::copy(fixture(sub), d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return d;
}

void expect_error(const troupe::Error& e, const std::vector<std::string>& parts) {
  EXPECT_EQ(e.code, troupe::ErrorCode::invalid_input) << e.message;
  for (const auto& p : parts) EXPECT_NE(e.message.find(p), std::string::npos) << "'" << p << "' not in: " << e.message;
}

}  // namespace

TEST(ModelDir, MixtralFixtureConfigMaps) {
  auto d = load_model_dir(fixture("mixtral").string());
  ASSERT_TRUE(d.ok()) << d.error().message;
  const auto& c = d->config;
  EXPECT_EQ(troupe::enum_name(c.family), "mixtral");
  EXPECT_FALSE(c.qk_norm());
  EXPECT_EQ(c.vocab_size, 360);
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 16);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);  // from rope_parameters (transformers 5)
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(d->bos_token_id, 1);
  EXPECT_EQ(d->eos_token_id, 0);
  ASSERT_TRUE(d->tokenizer);
  EXPECT_EQ(d->tokenizer->kind(), "bpe");
  EXPECT_EQ(d->tensors.size(), canonical_tensor_shapes(c).size());
  EXPECT_EQ(d->tensors.at("model.layers.1.mlp.experts.gate_up_proj").shape, (std::vector<int64_t>{4, 32, 32}));
  EXPECT_EQ(d->tensors.at("model.layers.1.mlp.experts.down_proj").shape, (std::vector<int64_t>{4, 32, 16}));
  EXPECT_TRUE(d->tensors.count("lm_head.weight"));
}

TEST(ModelDir, Qwen3FixtureConfigMaps) {
  auto d = load_model_dir(fixture("qwen3_moe").string());
  ASSERT_TRUE(d.ok()) << d.error().message;
  const auto& c = d->config;
  EXPECT_EQ(troupe::enum_name(c.family), "qwen3_moe");
  EXPECT_TRUE(c.qk_norm());
  EXPECT_EQ(c.num_experts, 4);  // written as num_local_experts by transformers 5
  EXPECT_EQ(c.intermediate_size, 24);
  EXPECT_EQ(c.moe_intermediate_size, 16);
  EXPECT_EQ(c.mlp_only_layers, std::vector<int>{0});
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FLOAT_EQ(c.rope_theta, 50000.0f);
  EXPECT_FALSE(d->tensors.count("lm_head.weight"));
  EXPECT_TRUE(d->tensors.count("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(d->tensors.count("model.layers.1.self_attn.q_norm.weight"));
}

// The dense and Qwen2-MoE fixtures: the config.json keys of each family land in ModelConfig.
TEST(ModelDir, FamilyFixtureConfigsMap) {
  auto l = load_model_dir(fixture("llama").string());
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(troupe::enum_name(l->config.family), "llama");
  EXPECT_EQ(l->config.num_experts, 0);
  EXPECT_EQ(l->config.rope_type, troupe::policy::RopeType::llama3);
  EXPECT_FLOAT_EQ(l->config.rope_factor, 8.0f);
  EXPECT_FLOAT_EQ(l->config.rope_high_freq_factor, 4.0f);
  EXPECT_EQ(l->config.rope_original_max_position_embeddings, 64);
  EXPECT_FALSE(l->config.qkv_bias || l->config.o_proj_bias || l->config.tie_word_embeddings);
  EXPECT_EQ(l->config.head_dim, 16);                        // hidden_size / num_attention_heads
  auto t = load_model_dir(fixture("llama_tied").string());  // transformers 4 spelling: rope_scaling {"type"}
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->config.rope_type, troupe::policy::RopeType::linear);
  EXPECT_FLOAT_EQ(t->config.rope_theta, 20000.0f);
  EXPECT_TRUE(t->config.tie_word_embeddings);
  EXPECT_FALSE(t->tensors.count("lm_head.weight"));
  auto q2 = load_model_dir(fixture("qwen2").string());
  ASSERT_TRUE(q2.ok()) << q2.error().message;
  EXPECT_TRUE(q2->config.qkv_bias);
  EXPECT_FALSE(q2->config.o_proj_bias);
  EXPECT_EQ(q2->tensors.at("model.layers.1.self_attn.k_proj.bias").shape, (std::vector<int64_t>{32}));
  auto q3 = load_model_dir(fixture("qwen3").string());
  ASSERT_TRUE(q3.ok()) << q3.error().message;
  EXPECT_TRUE(q3->config.qk_norm());
  EXPECT_EQ(q3->config.head_dim, 24);
  EXPECT_EQ(q3->tensors.at("model.layers.0.self_attn.o_proj.weight").shape, (std::vector<int64_t>{64, 96}));
  auto m = load_model_dir(fixture("qwen2_moe").string());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_TRUE(m->config.shared_expert_gated());
  EXPECT_TRUE(m->config.qkv_bias);
  EXPECT_FALSE(m->config.norm_topk_prob);
  EXPECT_EQ(m->config.mlp_only_layers, std::vector<int>{0});
  EXPECT_EQ(m->config.shared_expert_intermediate_size, 48);
  EXPECT_EQ(m->tensors.at("model.layers.1.mlp.shared_expert_gate.weight").shape,
            (std::vector<int64_t>{1, 64}));
  EXPECT_EQ(m->tensors.size(), canonical_tensor_shapes(m->config).size());
}

// config_to_hf_json then config_from_hf_json gives back every architecture field, for every family.
TEST(ModelDir, HfConfigRoundTripEveryFamily) {
  for (std::string fam : {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral"}) {
    troupe::policy::ModelConfig c;
    c.family = *troupe::enum_from_name<troupe::policy::ModelFamily>(fam);
    const bool dense = fam == "llama" || fam == "qwen2" || fam == "qwen3";
    if (dense) c.num_experts = 0, c.num_experts_per_tok = 0;
    if (fam == "llama") {
      c.qkv_bias = c.o_proj_bias = true;
      c.rope_type = troupe::policy::RopeType::llama3, c.rope_factor = 32, c.rope_original_max_position_embeddings = 512;
    }
    if (fam == "qwen3") c.rope_type = troupe::policy::RopeType::linear, c.rope_factor = 2;
    c.qkv_bias = c.qkv_bias || fam == "qwen2" || fam == "qwen2_moe";
    if (fam == "qwen2_moe") c.shared_expert_intermediate_size = 64, c.mlp_only_layers = {1};
    auto j = config_to_hf_json(c);
    ASSERT_TRUE(j.ok()) << fam << ": " << j.error().message;
    auto b = config_from_hf_json(*j);
    ASSERT_TRUE(b.ok()) << fam << ": " << b.error().message;
    EXPECT_EQ(troupe::enum_name(b->family), fam);
    EXPECT_EQ(b->num_experts, c.num_experts) << fam;
    EXPECT_EQ(b->qkv_bias, c.qkv_bias) << fam;
    EXPECT_EQ(b->o_proj_bias, c.o_proj_bias) << fam;
    EXPECT_EQ(b->rope_type, c.rope_type) << fam;
    EXPECT_FLOAT_EQ(b->rope_factor, c.rope_factor) << fam;
    EXPECT_EQ(b->rope_original_max_position_embeddings, c.rope_original_max_position_embeddings) << fam;
    EXPECT_EQ(b->shared_expert_intermediate_size, c.shared_expert_intermediate_size) << fam;
    EXPECT_EQ(b->mlp_only_layers, c.mlp_only_layers) << fam;
    EXPECT_EQ(canonical_tensor_shapes(*b), canonical_tensor_shapes(c)) << fam;
  }
  troupe::policy::ModelConfig bad;
  bad.family = troupe::policy::ModelFamily::qwen2;  // without its q/k/v biases
  EXPECT_FALSE(config_to_hf_json(bad).ok());
}

TEST(ModelDir, PerExpertAndFusedLayoutsLoadTheSameWeights) {
  for (std::string fam : {"mixtral", "qwen3_moe"}) {
    auto a = load_model_dir(fixture(fam).string());
    auto b = load_model_dir(fixture(fam + "_fused").string());
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(b.ok()) << b.error().message;
    expect_same_tensors(a->tensors, b->tensors);
  }
}

// Gate rows come first in gate_up_proj: expert 2's gate row 3 is w1 (Mixtral) / gate_proj (Qwen3) row 3.
TEST(ModelDir, FusedGateUpOrderMatchesPerExpert) {
  auto w = WeightSource::open_dir(fixture("mixtral").string());
  ASSERT_TRUE(w.ok());
  auto w1 = w->read("model.layers.0.block_sparse_moe.experts.2.w1.weight");
  auto w3 = w->read("model.layers.0.block_sparse_moe.experts.2.w3.weight");
  auto d = load_model_dir(fixture("mixtral").string());
  const Tensor& gu = d->tensors.at("model.layers.0.mlp.experts.gate_up_proj");  // (E, 2H, C)
  const size_t H = 16, C = 32;
  for (size_t k = 0; k < C; ++k) {
    EXPECT_EQ(gu.data[(2 * 2 * H + 3) * C + k], w1->data[3 * C + k]);
    EXPECT_EQ(gu.data[(2 * 2 * H + H + 3) * C + k], w3->data[3 * C + k]);
  }
}

TEST(ModelDir, SaveWritesTransformersNamesAndRoundTrips) {
  for (std::string fam : {"mixtral", "qwen3_moe"}) {
    auto src = load_model_dir(fixture(fam).string());
    ASSERT_TRUE(src.ok());
    for (auto layout : {ExpertLayout::per_expert, ExpertLayout::fused}) {
      auto out = temp_dir(fam + (layout == ExpertLayout::fused ? "_fused" : "_pe"));
      ASSERT_TRUE(save_model_dir(out.string(), src->config, src->tensors, src->tokenizer.get(), layout,
                                 src->bos_token_id, src->eos_token_id, src->pad_token_id)
                      .ok());
      const std::string ref = layout == ExpertLayout::fused ? fam + "_fused" : fam;
      EXPECT_EQ(file_names(out / "model.safetensors"), file_names(fixture(ref) / "model.safetensors")) << fam;
      auto back = load_model_dir(out.string());
      ASSERT_TRUE(back.ok()) << back.error().message;
      expect_same_tensors(back->tensors, src->tensors);
      EXPECT_EQ(back->config.mlp_only_layers, src->config.mlp_only_layers);
      EXPECT_EQ(back->config.num_experts, src->config.num_experts);
      EXPECT_FLOAT_EQ(back->config.rope_theta, src->config.rope_theta);
      EXPECT_EQ(back->config.tie_word_embeddings, src->config.tie_word_embeddings);
      EXPECT_EQ(back->eos_token_id, src->eos_token_id);
      ASSERT_TRUE(back->tokenizer);
      EXPECT_EQ(*back->tokenizer->encode("Hello"), *src->tokenizer->encode("Hello"));
    }
  }
}

// (E, C, 2H) / (E, H, C) expert tensors are recognised by shape; sizes here make 2H != C so the
// layouts differ (when 2H == C the transformers layout (E, 2H, C) is assumed).
TEST(ModelDir, TransposedFusedExpertsLoad) {
  for (std::string fam : {"mixtral", "qwen3_moe"}) {
    troupe::policy::ModelConfig c;
    c.family = *troupe::enum_from_name<troupe::policy::ModelFamily>(fam);
    c.vocab_size = 40, c.hidden_size = 24, c.num_hidden_layers = 2, c.num_attention_heads = 2;
    c.num_key_value_heads = 1, c.head_dim = 12, c.num_experts = 3, c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 8, c.intermediate_size = fam == "mixtral" ? 8 : 20;
    if (fam == "qwen3_moe") c.mlp_only_layers = {0};
    TensorMap canon;
    float v = 0.0f;
    for (const auto& [name, shape] : canonical_tensor_shapes(c)) {
      Tensor t{shape, {}};
      t.data.resize(t.numel());
      for (auto& x : t.data) {
        v += 0.37f;
        x = v - static_cast<float>(static_cast<int>(v)) - 0.5f;
      }
      canon[name] = t;
    }
    auto out = temp_dir("transposed_" + fam);
    ASSERT_TRUE(save_model_dir(out.string(), c, canon, nullptr, ExpertLayout::fused).ok());
    TensorMap disk = *read_safetensors((out / "model.safetensors").string());
    int n = 0;
    for (auto& [name, t] : disk) {
      if (!name.ends_with("experts.gate_up_proj") && !name.ends_with("experts.down_proj")) continue;
      const int64_t E = t.shape[0], A = t.shape[1], B = t.shape[2];
      Tensor tr{{E, B, A}, std::vector<float>(t.data.size())};
      for (int64_t e = 0; e < E; ++e)
        for (int64_t a = 0; a < A; ++a)
          for (int64_t b = 0; b < B; ++b) tr.data[(e * B + b) * A + a] = t.data[(e * A + a) * B + b];
      t = tr;
      ++n;
    }
    EXPECT_EQ(n, fam == "mixtral" ? 4 : 2);
    ASSERT_TRUE(write_safetensors((out / "model.safetensors").string(), disk).ok());
    auto back = load_model_dir(out.string());
    ASSERT_TRUE(back.ok()) << back.error().message;
    expect_same_tensors(back->tensors, canon);
    EXPECT_FALSE(back->tokenizer);
  }
}

TEST(ModelDir, ShardedCheckpointLoads) {
  auto src = load_model_dir(fixture("mixtral").string());
  auto disk = *hf_tensors_from_canonical(src->config, src->tensors, ExpertLayout::per_expert);
  auto out = copy_fixture("mixtral", "sharded");
  fs::remove(out / "model.safetensors");
  TensorMap a, b;
  json map;
  int i = 0;
  for (auto& [n, t] : disk) {
    const bool first = (i++ % 2) == 0;
    (first ? a : b)[n] = t;
    map[n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(write_safetensors((out / "model-00001-of-00002.safetensors").string(), a).ok());
  ASSERT_TRUE(write_safetensors((out / "model-00002-of-00002.safetensors").string(), b).ok());
  std::ofstream(out / "model.safetensors.index.json") << json{{"metadata", json::object()}, {"weight_map", map}}.dump();
  auto back = load_model_dir(out.string());
  ASSERT_TRUE(back.ok()) << back.error().message;
  expect_same_tensors(back->tensors, src->tensors);
}

TEST(ModelDir, ConfigErrorsNameTheKeyAndFile) {
  auto d = copy_fixture("mixtral", "cfgerr");
  const std::string cfg = (d / "config.json").string();
  json base = json::parse(std::ifstream(cfg));
  struct Case {
    std::string key;
    json value;
    std::vector<std::string> parts;
  };
  std::vector<Case> cases = {
      {"model_type", "gpt_neox", {"gpt_neox", "model_type"}},
      {"rope_parameters",
       json{{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 1e4}},
       {"dynamic", "rope_type"}},
      {"rope_scaling", json{{"type", "linear"}}, {"rope_scaling", "missing key \"factor\""}},
      {"mlp_bias", true, {"mlp_bias"}},
      {"attention_bias", true, {"attention_bias", "mixtral"}},
      {"sliding_window", 16, {"sliding_window 16", "use_sliding_window"}},
      {"hidden_act", "gelu", {"hidden_act", "gelu"}},
      {"num_key_value_heads", 3, {"num_key_value_heads"}},
      {"num_experts_per_tok", 9, {"num_experts_per_tok"}},
      {"hidden_size", "big", {"hidden_size", "wrong type"}},
      {"rope_parameters", json{{"rope_type", "yarn"}, {"rope_theta", 1e4}}, {"yarn"}},
      {"vocab_size", nullptr, {"missing key \"vocab_size\""}},
  };
  for (const auto& c : cases) {
    json j = base;
    j[c.key] = c.value;
    std::ofstream(cfg) << j.dump();
    auto r = load_model_dir(d.string());
    ASSERT_FALSE(r.ok()) << c.key;
    auto parts = c.parts;
    parts.push_back(cfg);
    expect_error(r.error(), parts);
  }
  std::ofstream(cfg) << "{\"model_type\": ";
  auto bad = load_model_dir(d.string());
  ASSERT_FALSE(bad.ok());
  expect_error(bad.error(), {cfg, "not valid JSON"});
  fs::remove(cfg);
  auto missing = load_model_dir(d.string());
  ASSERT_FALSE(missing.ok());
  expect_error(missing.error(), {cfg, "missing config.json"});
  auto nodir = load_model_dir((d / "nope").string());
  ASSERT_FALSE(nodir.ok());
  expect_error(nodir.error(), {"nope", "not a model directory"});
}

TEST(ModelDir, TensorErrorsNameTheTensorAndFile) {
  auto src = load_model_dir(fixture("qwen3_moe").string());
  auto disk = *hf_tensors_from_canonical(src->config, src->tensors, ExpertLayout::per_expert);
  auto d = copy_fixture("qwen3_moe", "tenserr");
  const std::string st = (d / "model.safetensors").string();

  auto missing = disk;
  missing.erase("model.layers.1.mlp.experts.3.up_proj.weight");
  ASSERT_TRUE(write_safetensors(st, missing).ok());
  auto r1 = load_model_dir(d.string());
  ASSERT_FALSE(r1.ok());
  expect_error(r1.error(), {st, "model.layers.1.mlp.experts.3.up_proj.weight", "missing"});

  auto shape = disk;
  shape["model.layers.0.self_attn.q_norm.weight"] = Tensor{{9}, std::vector<float>(9, 1.0f)};
  ASSERT_TRUE(write_safetensors(st, shape).ok());
  auto r2 = load_model_dir(d.string());
  ASSERT_FALSE(r2.ok());
  expect_error(r2.error(), {st, "model.layers.0.self_attn.q_norm.weight", "(9,)", "(8,)"});

  auto extra = disk;
  extra["model.layers.7.mlp.gate.weight"] = Tensor{{1}, {0.0f}};
  ASSERT_TRUE(write_safetensors(st, extra).ok());
  auto r3 = load_model_dir(d.string());
  ASSERT_FALSE(r3.ok());
  expect_error(r3.error(), {st, "unexpected tensor 'model.layers.7.mlp.gate.weight'"});

  ASSERT_TRUE(write_safetensors(st, disk, {}, DType::bf16).ok());  // bf16 weights load (converted)
  auto r4 = load_model_dir(d.string());
  ASSERT_TRUE(r4.ok()) << r4.error().message;

  std::ofstream(st, std::ios::trunc) << "12345678";
  auto r5 = load_model_dir(d.string());
  ASSERT_FALSE(r5.ok());
  expect_error(r5.error(), {st});
  fs::remove(st);
  auto r6 = load_model_dir(d.string());
  ASSERT_FALSE(r6.ok());
  expect_error(r6.error(), {"model.safetensors", "missing weights"});
}

TEST(ModelDir, HfConfigRoundTrip) {
  troupe::policy::ModelConfig c;
  c.family = troupe::policy::ModelFamily::qwen3_moe;
  c.mlp_only_layers = {0, 2};
  c.norm_topk_prob = false;
  c.router_aux_loss_coef = 0.01f;
  auto j = config_to_hf_json(c);
  ASSERT_TRUE(j.ok());
  auto back = config_from_hf_json(*j);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->mlp_only_layers, c.mlp_only_layers);
  EXPECT_EQ(back->norm_topk_prob, false);
  EXPECT_FLOAT_EQ(back->router_aux_loss_coef, 0.01f);
  EXPECT_EQ(back->head_dim, c.head_dim);
  // decoder_sparse_step 2 makes every odd-numbered (0-based even) layer dense.
  json s = *j;
  s["decoder_sparse_step"] = 2;
  s["mlp_only_layers"] = json::array();
  auto step = config_from_hf_json(s);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->mlp_only_layers, (std::vector<int>{0, 2}));
}

TEST(ModelDir, SavingReplacesATokenizerOfTheOtherKind) {
  auto src = load_model_dir(fixture("mixtral").string());
  ASSERT_TRUE(src.ok());
  auto out = copy_fixture("mixtral", "retok");  // has tokenizer.json
  auto byte_tok = make_char_tokenizer({});
  ASSERT_TRUE(save_model_dir(out.string(), src->config, src->tensors, byte_tok->get()).ok());
  EXPECT_FALSE(fs::exists(out / kHfTokenizerFile));
  auto back = load_model_dir(out.string());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->tokenizer->kind(), "byte");
  EXPECT_EQ(back->eos_token_id, 2);  // from the tokenizer when none is given
}
