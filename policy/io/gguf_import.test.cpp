// policy.gguf_import: tiny llama, qwen2 and qwen3 GGUFs (tests/gguf/make_fixtures.py) imported to
// Hugging Face directories: config, tied head, llama's q/k un-permuted to the package-side originals,
// the other tensors equal to the reader's, the rebuilt byte-level BPE tokenizer, and the bad-input paths.
#include "troupe/policy/io/gguf_import.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_temp_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/tokenizer.h"

namespace fs = std::filesystem;
using namespace troupe::policy::io;
using nlohmann::json;

namespace {

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("TROUPE_GGUF_FIXTURES");
  return (fs::path(dir ? dir : "tests/gguf") / name).string();
}

fs::path temp_dir(const std::string& name) { return troupe::policy::io::testing::make_temp_dir("gguf_import", name); }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

}  // namespace

TEST(GgufImport, NameMap) {
  EXPECT_EQ(hf_name_from_gguf("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(hf_name_from_gguf("output.weight"), "lm_head.weight");
  EXPECT_EQ(hf_name_from_gguf("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.12.attn_output.weight"), "model.layers.12.self_attn.o_proj.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.0.ffn_norm.weight"), "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.0.attn_norm.weight"), "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.3.ffn_gate.weight"), "model.layers.3.mlp.gate_proj.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.3.whatever.weight"), "");
}

TEST(GgufImport, TinyLlama) {
  auto f = GgufFile::open(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto imp = import_gguf(*f);
  ASSERT_TRUE(imp.ok()) << imp.error().message;
  const json& c = imp->config;
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["hidden_size"], 32);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["num_attention_heads"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["head_dim"], 8);
  EXPECT_EQ(c["intermediate_size"], 64);
  EXPECT_EQ(c["max_position_embeddings"], 256);
  EXPECT_EQ(c["vocab_size"], 264);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_FLOAT_EQ(c["rope_theta"].get<float>(), 10000.0f);
  EXPECT_FLOAT_EQ(c["rms_norm_eps"].get<float>(), 1e-6f);
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  EXPECT_EQ(imp->tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(imp->tensors.size(), 2u + 2u * 9u);

  // q/k: the HF originals before convert_hf_to_gguf's permutation, exactly.
  auto hf = GgufFile::open(fixture("tiny_llama_hf.gguf"));
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  for (const auto& info : hf->tensors()) {
    SCOPED_TRACE(info.name);
    auto want = hf->read(info.name);
    ASSERT_TRUE(want.ok());
    ASSERT_TRUE(imp->tensors.count(info.name));
    EXPECT_EQ(imp->tensors[info.name].shape, want->shape);
    EXPECT_EQ(imp->tensors[info.name].data, want->data);
  }
  // Everything else is the reader's dequantization under its HF name.
  for (const auto& info : f->tensors()) {
    if (info.name.find("attn_q") != std::string::npos || info.name.find("attn_k") != std::string::npos) continue;
    auto want = f->read(info.name);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(imp->tensors[hf_name_from_gguf(info.name)].data, want->data) << info.name;
  }
  EXPECT_EQ(imp->tokenizer_config["bos_token"], "<|im_start|>");
  EXPECT_EQ(imp->tokenizer_config["eos_token"], "<|im_end|>");
  EXPECT_EQ(imp->tokenizer_config["add_bos_token"], false);
  EXPECT_NE(imp->tokenizer_config["chat_template"].get<std::string>().find("im_start"), std::string::npos);
}

TEST(GgufImport, DirectoryAndTokenizer) {
  const auto d = temp_dir("dir");
  ASSERT_TRUE(import_gguf_to_dir(fixture("tiny_llama.gguf"), d.string()).ok());
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(d / name)) << name;
  EXPECT_EQ(read_json(d / "generation_config.json")["eos_token_id"], 2);
  auto tensors = read_safetensors((d / "model.safetensors").string());
  ASSERT_TRUE(tensors.ok()) << tensors.error().message;
  EXPECT_EQ(tensors->at("model.embed_tokens.weight").shape, (std::vector<int64_t>{264, 32}));

  auto tok = load_tokenizer_dir(d.string());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ((*tok)->vocab_size(), 264);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  // Merges "h e", "l l", "he ll", "Ġ w", "o r" (ids 259..263); digits split one by one (smollm).
  auto ids = (*tok)->encode("<|im_start|>hello world 42");
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  const int32_t b = 3;  // byte tokens start after the 3 specials
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 261, b + 'o', 262, 263, b + 'l', b + 'd', b + ' ', b + '4', b + '2'}))
      << "(the space before 42 is its own piece)";
  auto text = (*tok)->decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|im_start|>hello world 42");

  // bf16 output: each value is the bf16 rounding of the fp32 import.
  const auto d16 = temp_dir("bf16");
  ASSERT_TRUE(import_gguf_to_dir(fixture("tiny_llama.gguf"), d16.string(), DType::bf16).ok());
  auto t16 = read_safetensors((d16 / "model.safetensors").string());
  ASSERT_TRUE(t16.ok());
  const auto& a = tensors->at("model.layers.0.mlp.up_proj.weight").data;
  const auto& h = t16->at("model.layers.0.mlp.up_proj.weight").data;
  for (size_t k = 0; k < a.size(); ++k) ASSERT_EQ(h[k], bf16_to_float(float_to_bf16(a[k])));
  EXPECT_EQ(read_json(d16 / "config.json")["torch_dtype"], "bfloat16");
}

TEST(GgufImport, GgufPathLoadsThroughTheCache) {
  const auto cache = temp_dir("cache");
  ::setenv("TROUPE_CACHE", cache.c_str(), 1);
  auto dir = cached_gguf_import(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(dir.ok()) << dir.error().message;
  EXPECT_TRUE(fs::exists(fs::path(*dir) / "config.json"));
  EXPECT_EQ(fs::path(*dir).parent_path(), cache / "gguf");
  auto again = cached_gguf_import(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *dir);
  // load_model takes the .gguf path (through the same cache).
  auto loaded = load_model(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(troupe::enum_name(loaded->model.config().family), "llama");
}

// qwen2 (q/k/v biases) and qwen3 (q/k RMSNorm, head_dim from key_length, untied head): stored as in
// the checkpoint (no q/k permutation), every tensor equal to the reader's under its HF name, and the
// directory loads in its family and scores text.
TEST(GgufImport, Qwen2AndQwen3) {
  for (const std::string arch : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(arch);
    auto f = GgufFile::open(fixture("tiny_" + arch + ".gguf"));
    ASSERT_TRUE(f.ok()) << f.error().message;
    auto imp = import_gguf(*f);
    ASSERT_TRUE(imp.ok()) << imp.error().message;
    const json& c = imp->config;
    EXPECT_EQ(c["model_type"], arch);
    EXPECT_EQ(c["architectures"][0], arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM");
    EXPECT_EQ(c["head_dim"], arch == "qwen2" ? 8 : 16);
    EXPECT_EQ(c["tie_word_embeddings"], arch == "qwen2");
    EXPECT_EQ(c["use_sliding_window"], false);
    EXPECT_FLOAT_EQ(c["rope_theta"].get<float>(), 1e6f);
    EXPECT_EQ(c.contains("attention_bias"), arch == "qwen3");
    // 9 tensors per layer + 3 biases (qwen2) or 2 norms (qwen3); embeddings, final norm, head when untied.
    EXPECT_EQ(imp->tensors.size(), arch == "qwen2" ? 2u + 2u * 12u : 3u + 2u * 11u);
    for (const auto& info : f->tensors()) {
      auto want = f->read(info.name);
      ASSERT_TRUE(want.ok());
      const std::string hf = hf_name_from_gguf(info.name);
      ASSERT_TRUE(imp->tensors.count(hf)) << info.name;
      EXPECT_EQ(imp->tensors[hf].data, want->data) << info.name;
    }
    EXPECT_EQ(imp->tensors.count("model.layers.1.self_attn.q_proj.bias"), arch == "qwen2" ? 1u : 0u);
    EXPECT_EQ(imp->tensors.count("model.layers.1.self_attn.k_norm.weight"), arch == "qwen3" ? 1u : 0u);

    const auto d = temp_dir(arch);
    ASSERT_TRUE(import_gguf_to_dir(fixture("tiny_" + arch + ".gguf"), d.string()).ok());
    auto loaded = load_model(d.string());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    EXPECT_EQ(troupe::enum_name(loaded->model.config().family), arch);
    EXPECT_EQ(loaded->model.config().qkv_bias, arch == "qwen2");
    auto lp = score_tokens(loaded->model, {1, 50, 60, 70, 80});
    ASSERT_TRUE(lp.ok()) << lp.error().message;
    ASSERT_EQ(lp->size(), 4u);
    for (float v : *lp) EXPECT_TRUE(std::isfinite(v) && v < 0.0f) << v;
  }
}

TEST(GgufImport, BadInputNamesFileAndReason) {
  auto expect_error = [](const std::string& path, const std::string& what) {
    const auto d = temp_dir("bad" + std::to_string(std::hash<std::string>{}(path + what) % 100000));
    auto st = import_gguf_to_dir(path, d.string());
    ASSERT_FALSE(st.ok()) << path;
    EXPECT_EQ(st.error().code, troupe::ErrorCode::invalid_input);
    EXPECT_NE(st.error().message.find(path), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
  };
  expect_error(fixture("tiny_llama_badvocab.gguf"), "vocabulary size mismatch");
  expect_error(fixture("unsupported.gguf"), "general.architecture \"test\" is not supported");
  // A truncated copy of the tiny llama.
  const auto d = temp_dir("trunc");
  std::ifstream in(fixture("tiny_llama.gguf"), std::ios::binary);
  std::string bytes(std::istreambuf_iterator<char>(in), {});
  const auto p = (d / "t.gguf").string();
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 5000));
  expect_error(p, "runs past the end");
}

// A `llama` (SentencePiece) vocabulary: tokenizer.json with byte_fallback + Metaspace, merges from the
// scores; ids equal transformers' GGUF tokenizer (and `tokenizers` on troupe's file: tiny_spm_tokens.json).
TEST(GgufImport, SentencePieceVocabulary) {
  const auto d = temp_dir("spm");
  ASSERT_TRUE(import_gguf_to_dir(fixture("tiny_llama_spm.gguf"), d.string()).ok());
  const json tj = read_json(d / "tokenizer.json");
  EXPECT_EQ(tj["model"]["byte_fallback"], true);
  EXPECT_EQ(tj["pre_tokenizer"]["type"], "Metaspace");
  EXPECT_EQ(read_json(d / "tokenizer_config.json")["add_bos_token"], true);
  auto tok = load_tokenizer_dir(d.string());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ((*tok)->bos_id(), 1);
  const json ref = read_json(fixture("tiny_spm_tokens.json"));
  ASSERT_FALSE(ref["transformers"].empty());
  for (auto it = ref["transformers"].begin(); it != ref["transformers"].end(); ++it) {
    SCOPED_TRACE(it.key());
    auto ids = (*tok)->encode(it.key());
    ASSERT_TRUE(ids.ok()) << ids.error().message;
    EXPECT_EQ(*ids, it.value().get<std::vector<int32_t>>());
    EXPECT_EQ(*ids, ref["tokenizers_on_troupe_json"][it.key()].get<std::vector<int32_t>>());
    auto text = (*tok)->decode(*ids);
    ASSERT_TRUE(text.ok()) << text.error().message;
    if (it.key().empty() || it.key()[0] != ' ') {  // a leading space is stripped, as in HF
      EXPECT_EQ(*text, it.key());
    }
  }
}
