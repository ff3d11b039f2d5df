// policy.lora_peft_io: PEFT-made LoRA adapters (tests/peft/, make_peft_fixture.py) read with their
// names, shapes and values; written back tensor for tensor byte-identical; every refused key,
// tensor name and shape named in the error; the YAML kind <-> PEFT module mapping; the fingerprint.
#include "troupe/policy/io/peft_adapter.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_temp_dir.h"
#include "troupe/policy/io/model_io.h"

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
fs::path temp_dir(const std::string& name) { return troupe::policy::io::testing::make_temp_dir("lora_peft_io", name); }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}
void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

std::vector<TensorSpec> base_table(const std::string& family_dir) {
  auto dir = load_model_dir(hf_fixture(family_dir).string());
  EXPECT_TRUE(dir.ok()) << dir.error().message;
  auto model = model_from_dir(dir.value());
  EXPECT_TRUE(model.ok()) << model.error().message;
  return model.value().tensors();
}

// A copy of a fixture adapter in a temp dir, for corrupting.
fs::path copy_adapter(const std::string& c, const std::string& name) {
  fs::path d = temp_dir(name);
  fs::copy(peft_fixture(c) / "adapter", d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return d;
}

void flatten(const TensorMap& m, std::vector<TensorSpec>& specs, std::vector<float>& values) {
  for (const auto& [name, t] : m) {
    specs.push_back(TensorSpec{name, t.shape, values.size()});
    values.insert(values.end(), t.data.begin(), t.data.end());
  }
}

// The error of reading `dir` contains every one of `needles`.
void expect_refused(const fs::path& dir, const std::vector<std::string>& needles, std::span<const TensorSpec> base = {}) {
  auto r = read_peft_adapter(dir.string(), base);
  ASSERT_FALSE(r.ok()) << dir;
  for (const auto& n : needles) EXPECT_NE(r.error().message.find(n), std::string::npos) << r.error().message << "\n  lacks: " << n;
}

}  // namespace

TEST(PeftAdapter, ReadsPeftFilesExactly) {
  for (const std::string c : {"llama", "qwen3", "qwen3_rslora"}) {
    const json expected = read_json(peft_fixture(c) / "expected.json");
    const std::string base = c == "llama" ? "llama" : "qwen3";
    const auto table = base_table(base);
    auto r = read_peft_adapter((peft_fixture(c) / "adapter").string(), table);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const PeftAdapter& a = r.value();
    EXPECT_EQ(a.config.r, 4);
    EXPECT_EQ(a.config.lora_alpha, 8);
    EXPECT_EQ(a.config.use_rslora, c == "qwen3_rslora");
    EXPECT_DOUBLE_EQ(a.config.scaling(), c == "qwen3_rslora" ? 4.0 : 2.0);
    EXPECT_EQ(a.config.base_model_name_or_path, "tests/hf_fixture/" + base);
    EXPECT_EQ(a.modules().size(), 14u);  // 2 layers x q k v o gate up down
    ASSERT_EQ(a.tensors.size(), expected["adapter_tensors"].size());
    for (const auto& [name, probe] : expected["adapter_tensors"].items()) {
      ASSERT_TRUE(a.tensors.count(name)) << name;
      const Tensor& t = a.tensors.at(name);
      EXPECT_EQ(t.shape, probe["shape"].get<std::vector<int64_t>>()) << name;
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t.data[i], probe["first"][i].get<float>()) << name << "[" << i << "]";
    }
  }
}

TEST(PeftAdapter, WritesBackByteIdenticalTensorsAndPeftConfig) {
  for (const std::string c : {"llama", "qwen3_rslora"}) {
    auto r = read_peft_adapter((peft_fixture(c) / "adapter").string());
    ASSERT_TRUE(r.ok()) << r.error().message;
    std::vector<TensorSpec> specs;
    std::vector<float> values;
    flatten(r.value().tensors, specs, values);
    const fs::path out = temp_dir("write_" + c);
    auto st = write_peft_adapter(out.string(), r.value().config, specs, values);
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto theirs = SafetensorsFile::open((peft_fixture(c) / "adapter" / kAdapterWeightsFile).string());
    auto ours = SafetensorsFile::open((out / kAdapterWeightsFile).string());
    ASSERT_TRUE(theirs.ok() && ours.ok());
    ASSERT_EQ(ours.value().entries().size(), theirs.value().entries().size());
    for (const auto& e : theirs.value().entries()) {
      const SafetensorsEntry* o = ours.value().find(e.name);
      ASSERT_NE(o, nullptr) << e.name;
      EXPECT_EQ(o->dtype, "F32");
      EXPECT_EQ(o->shape, e.shape);
      const Tensor a = theirs.value().read(e.name).value(), b = ours.value().read(e.name).value();
      EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)), 0) << e.name;
    }
    // Every key PEFT wrote is written, with the same values (peft_version is PEFT's own).
    json peft = read_json(peft_fixture(c) / "adapter" / kAdapterConfigFile), mine = read_json(out / kAdapterConfigFile);
    peft.erase("peft_version");
    json peft_targets = peft["target_modules"], my_targets = mine["target_modules"];
    std::sort(peft_targets.begin(), peft_targets.end());
    peft.erase("target_modules");
    mine.erase("target_modules");
    EXPECT_EQ(mine, peft) << mine.dump(1) << "\n" << peft.dump(1);
    EXPECT_EQ(my_targets, peft_targets);
    auto back = read_peft_adapter(out.string());
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back.value().config.target_modules, r.value().config.target_modules);
  }
}

TEST(PeftAdapter, EmptyTargetModulesBecomeTheAdaptedPaths) {
  auto r = read_peft_adapter((peft_fixture("llama") / "adapter").string());
  ASSERT_TRUE(r.ok());
  PeftAdapterConfig c = r.value().config;
  c.target_modules.clear();
  std::vector<TensorSpec> specs;
  std::vector<float> values;
  flatten(r.value().tensors, specs, values);
  const fs::path out = temp_dir("targets");
  ASSERT_TRUE(write_peft_adapter(out.string(), c, specs, values).ok());
  EXPECT_EQ(read_json(out / kAdapterConfigFile)["target_modules"].size(), 14u);
  EXPECT_EQ(read_json(out / kAdapterConfigFile)["target_modules"][0], "model.layers.0.mlp.down_proj");
  // A tensor that is not a LoRA pair, or of another rank, is refused on write.
  specs[0].name = "model.layers.0.mlp.down_proj.weight";
  auto st = write_peft_adapter(temp_dir("targets_bad").string(), c, specs, values);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("model.layers.0.mlp.down_proj.weight"), std::string::npos) << st.error().message;
}

TEST(PeftAdapter, RefusesKeysThatChangeTheMath) {
  const std::string file = kAdapterConfigFile;
  const std::vector<std::pair<std::string, json>> cases = {
      {"use_dora", true}, {"lora_bias", true}, {"fan_in_fan_out", true}, {"modules_to_save", json::array({"lm_head"})},
      {"layer_replication", json::array({json::array({0, 1})})}, {"rank_pattern", {{"q_proj", 8}}},
      {"alpha_pattern", {{"q_proj", 16}}}, {"target_parameters", json::array({"mlp.experts.gate_up_proj"})},
      {"trainable_token_indices", json::array({1, 2})}, {"some_future_option", {{"on", true}}},
      {"bias", "all"}, {"init_lora_weights", "pissa"}, {"peft_type", "IA3"}, {"task_type", "SEQ_CLS"},
      {"r", "four"}};
  for (const auto& [key, value] : cases) {
    const fs::path d = copy_adapter("llama", "key_" + key);
    json j = read_json(d / file);
    j[key] = value;
    write_json(d / file, j);
    expect_refused(d, {(d / file).string(), "'" + key + "'"});
  }
  // A new key at its neutral value (null, false, {}) is accepted, as are the bookkeeping ones.
  const fs::path d = copy_adapter("llama", "neutral");
  json j = read_json(d / file);
  j["some_future_option"] = nullptr;
  j["another_future_flag"] = false;
  j["layers_to_transform"] = json::array({0, 1});
  j["init_lora_weights"] = "gaussian";
  write_json(d / file, j);
  auto ok = read_peft_adapter(d.string());
  EXPECT_TRUE(ok.ok()) << ok.error().message;
  // Missing keys and files.
  const fs::path m = copy_adapter("llama", "missing_r");
  j = read_json(m / file);
  j.erase("r");
  write_json(m / file, j);
  expect_refused(m, {(m / file).string(), "'r'"});
  const fs::path nf = copy_adapter("llama", "no_config");
  fs::remove(nf / file);
  expect_refused(nf, {(nf / file).string()});
  const fs::path nw = copy_adapter("llama", "no_weights");
  fs::remove(nw / kAdapterWeightsFile);
  expect_refused(nw, {(nw / kAdapterWeightsFile).string(), "missing"});
  const fs::path bad = copy_adapter("llama", "bad_json");
  std::ofstream(bad / file) << "{\"r\": 4,";
  expect_refused(bad, {(bad / file).string(), "JSON"});
}

TEST(PeftAdapter, RefusesBadTensors) {
  auto r = read_peft_adapter((peft_fixture("llama") / "adapter").string());
  ASSERT_TRUE(r.ok());
  const TensorMap good = r.value().tensors;
  const std::string q = "model.layers.0.self_attn.q_proj";
  auto rewrite = [&](const std::string& name, const TensorMap& m) {
    const fs::path d = copy_adapter("llama", name);
    EXPECT_TRUE(write_safetensors((d / kAdapterWeightsFile).string(), m).ok());
    return d;
  };
  const std::string wfile = kAdapterWeightsFile;
  TensorMap m = good;  // a name that is no LoRA weight
  m["base_model.model." + q + ".lora_embedding_A"] = m.at(lora_a_name(q));
  expect_refused(rewrite("bad_name", m), {wfile, "lora_embedding_A", "not a LoRA weight"});
  m = good;  // half a pair
  m.erase(lora_b_name(q));
  expect_refused(rewrite("no_b", m), {wfile, lora_b_name(q), "missing"});
  m = good;  // rank != r
  m[lora_a_name(q)] = Tensor{{5, 64}, std::vector<float>(5 * 64, 0.f)};
  expect_refused(rewrite("rank", m), {wfile, lora_a_name(q), "(5, 64)", "r is 4"});
  const auto llama = base_table("llama");
  m = good;  // in_features that disagree with the base
  m[lora_a_name(q)] = Tensor{{4, 32}, std::vector<float>(4 * 32, 0.f)};
  expect_refused(rewrite("in_features", m), {wfile, lora_a_name(q), "(4, 32)", q + ".weight"}, llama);
  // The qwen3 adapter on the llama base: k_proj's out_features (2 kv heads x 24) is not llama's 32.
  const std::string k = "model.layers.0.self_attn.k_proj";
  expect_refused(peft_fixture("qwen3") / "adapter", {lora_b_name(k), "(48, 4)", "(32, 64)"}, llama);
  m = good;  // a module the base does not have, and the head
  m[lora_a_name("model.layers.7.self_attn.q_proj")] = m.at(lora_a_name(q));
  m[lora_b_name("model.layers.7.self_attn.q_proj")] = m.at(lora_b_name(q));
  expect_refused(rewrite("no_module", m), {wfile, "model.layers.7.self_attn.q_proj", "not a linear projection"}, llama);
  m = good;
  m[lora_a_name("lm_head")] = Tensor{{4, 64}, std::vector<float>(4 * 64, 0.f)};
  m[lora_b_name("lm_head")] = Tensor{{360, 4}, std::vector<float>(360 * 4, 0.f)};
  expect_refused(rewrite("head", m), {wfile, "lm_head", "embedding / head"}, llama);
}

TEST(PeftAdapter, TargetKindsAndModuleNames) {
  auto all = [](ModelFamily f) { return peft_target_modules(f, {"all_linear"}).value(); };
  EXPECT_EQ(all(ModelFamily::llama),
            (std::vector<std::string>{"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"}));
  EXPECT_EQ(all(ModelFamily::mixtral), (std::vector<std::string>{"k_proj", "o_proj", "q_proj", "v_proj", "w1", "w2", "w3"}));
  EXPECT_EQ(all(ModelFamily::qwen3_moe), all(ModelFamily::qwen3));
  EXPECT_EQ(peft_target_modules(ModelFamily::qwen3, {"v", "q"}).value(), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(peft_target_modules(ModelFamily::mixtral, {"experts"}).value(), (std::vector<std::string>{"w1", "w2", "w3"}));
  auto no_experts = peft_target_modules(ModelFamily::llama, {"experts"});
  ASSERT_FALSE(no_experts.ok());
  EXPECT_NE(no_experts.error().message.find("'experts'"), std::string::npos);
  EXPECT_FALSE(peft_target_modules(ModelFamily::mixtral, {"gate"}).ok());
  auto unknown = peft_target_modules(ModelFamily::llama, {"qkv"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("'qkv'"), std::string::npos);

  EXPECT_EQ(lora_kind_of_module(ModelFamily::llama, "model.layers.3.self_attn.q_proj"), "q");
  EXPECT_EQ(lora_kind_of_module(ModelFamily::llama, "model.layers.3.self_attn.o_proj"), "o");
  EXPECT_EQ(lora_kind_of_module(ModelFamily::qwen3, "model.layers.0.mlp.down_proj"), "down");
  EXPECT_EQ(lora_kind_of_module(ModelFamily::qwen3_moe, "model.layers.1.mlp.gate_proj"), "gate");
  EXPECT_EQ(lora_kind_of_module(ModelFamily::qwen3_moe, "model.layers.3.mlp.experts.5.gate_proj"), "experts");
  EXPECT_EQ(lora_kind_of_module(ModelFamily::mixtral, "model.layers.3.block_sparse_moe.experts.5.w1"), "experts");
  EXPECT_EQ(lora_kind_of_module(ModelFamily::qwen2_moe, "model.layers.3.mlp.shared_expert.gate_proj"), "");
  EXPECT_EQ(lora_kind_of_module(ModelFamily::qwen3_moe, "model.layers.3.mlp.gate"), "");
  EXPECT_EQ(lora_kind_of_module(ModelFamily::llama, "lm_head"), "");
  // Every module a kind names maps back to that kind, on the fixtures' real tensor tables.
  for (const std::string fam : {"llama", "qwen3", "mixtral", "qwen3_moe", "qwen2_moe"}) {
    auto dir = load_model_dir(hf_fixture(fam).string());
    ASSERT_TRUE(dir.ok()) << dir.error().message;
    const ModelFamily f = dir.value().config.family;
    const auto names = all(f);
    int adapted = 0;
    auto model = model_from_dir(dir.value());
    ASSERT_TRUE(model.ok()) << model.error().message;
    for (const TensorSpec& t : model.value().tensors()) {
      if (t.shape.size() != 2 || t.name.size() < 7) continue;
      const std::string module = t.name.substr(0, t.name.size() - 7);
      const std::string kind = lora_kind_of_module(f, module);
      if (kind.empty()) continue;
      ++adapted;
      const auto kind_names = peft_target_modules(f, {kind}).value();
      const std::string leaf = module.substr(module.rfind('.') + 1);
      EXPECT_NE(std::find(kind_names.begin(), kind_names.end(), leaf), kind_names.end()) << fam << " " << module;
    }
    EXPECT_GT(adapted, 0) << fam;
  }
}

TEST(PeftAdapter, BaseFingerprint) {
  const json cfg = read_json(hf_fixture("llama") / "config.json");
  const auto table = base_table("llama");
  const std::string fp = base_fingerprint(cfg, table);
  EXPECT_EQ(fp.rfind("xxh3:", 0), 0u);
  EXPECT_EQ(fp.size(), 21u);
  // Key order and whitespace do not matter; LoRA tensors in the table are left out.
  json reordered = json::parse(cfg.dump(4));
  auto with_lora = table;
  with_lora.push_back(TensorSpec{lora_a_name("model.layers.0.self_attn.q_proj"), {4, 64}, 0});
  EXPECT_EQ(base_fingerprint(reordered, with_lora), fp);
  json other = cfg;
  other["rms_norm_eps"] = 1e-5;
  EXPECT_NE(base_fingerprint(other, table), fp);
  auto reshaped = table;
  reshaped[0].shape[0] += 1;
  EXPECT_NE(base_fingerprint(cfg, reshaped), fp);
  EXPECT_NE(base_fingerprint(read_json(hf_fixture("qwen3") / "config.json"), base_table("qwen3")), fp);
}

TEST(PeftAdapter, BaseReference) {
  const fs::path d = temp_dir("base_ref");
  const std::string f = (d / kAdapterBaseFile).string();
  ASSERT_TRUE(write_adapter_base_ref(f, {"/models/llama", "xxh3:0123456789abcdef", std::nullopt}).ok());
  auto r = read_adapter_base_ref(f);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().path, "/models/llama");
  EXPECT_EQ(r.value().fingerprint, "xxh3:0123456789abcdef");
  EXPECT_FALSE(r.value().base_dtype.has_value());  // an fp32 base records none
  // A QLoRA run's base: its policy.base_dtype round-trips.
  ASSERT_TRUE(write_adapter_base_ref(f, {"/models/m.gguf", "", BaseDtype::gguf}).ok());
  auto q = read_adapter_base_ref(f);
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(q.value().base_dtype, BaseDtype::gguf);
  for (const std::string bad : {R"({"fingerprint": "x"})", R"({"path": 3})", R"({"path": "a", "extra": 1})", "[1",
                                R"({"path": "a", "base_dtype": "q9"})", R"({"path": "a", "base_dtype": 4})"}) {
    std::ofstream(f) << bad;
    auto e = read_adapter_base_ref(f);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().message.find(f), std::string::npos) << e.error().message;
  }
  EXPECT_FALSE(read_adapter_base_ref((d / "absent.json").string()).ok());
}
