// GGUF -> Hugging Face directory (architectures llama, qwen2, qwen3). The config comes from the
// `<arch>.*` keys, the tensors from the
// name map below (q/k rows un-permuted), the tokenizer from `tokenizer.ggml.*`: a `gpt2`
// byte-level BPE vocabulary becomes a tokenizer.json whose pre-tokenizer follows
// `tokenizer.ggml.pre` as llama.cpp splits text. Every size the file states is checked against
// the tensors (vocabulary vs token_embd rows, heads x head_dim vs q/k/v rows).
#include "troupe/policy/io/gguf_import.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <regex>

namespace troupe::policy::io {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// llama.cpp's pre-tokenizer regexes (llama-vocab.cpp) as tokenizer.json Split steps before a
// ByteLevel step without its own regex; "" = ByteLevel's GPT-2 regex.
struct PreTokenizer {
  const char* name;
  std::vector<const char*> splits;
};

constexpr const char* kGpt2Split = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr const char* kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const std::vector<PreTokenizer>& pre_tokenizers() {
  static const std::vector<PreTokenizer> table = {
      {"default", {kGpt2Split}}, {"gpt2", {kGpt2Split}},
      // SmolLM's tokenizer.json: Digits(individual_digits) then ByteLevel(use_regex).
      {"smollm", {"\\p{N}", kGpt2Split}},
      {"llama-bpe", {kLlama3Split}}, {"llama3", {kLlama3Split}}, {"qwen2", {kQwen2Split}},
  };
  return table;
}

json split_step(const std::string& regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}

// A tokenizers-library tokenizer.json with a BPE model: the parts the two GGUF vocabularies differ
// in are the pre-tokenizer, the decoder, the unknown token and byte fallback (which fuses unknowns).
json bpe_tokenizer_json(const json& added, const json& pre_tokenizer, const json& decoder, const json& vocab,
                        const json& merges, const json& unk_token, bool byte_fallback) {
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", nullptr},
      {"decoder", decoder},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk_token}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", byte_fallback}, {"byte_fallback", byte_fallback},
        {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}},
  };
}

// tokenizer.ggml.token_type, when present, one entry per token (empty when absent).
Result<std::vector<int64_t>> token_types(const GgufFile& f, size_t num_tokens) {
  std::vector<int64_t> types;
  if (f.get("tokenizer.ggml.token_type")) {
    TROUPE_ASSIGN_OR_RETURN(types, f.get_ints("tokenizer.ggml.token_type"));
  }
  if (!types.empty() && types.size() != num_tokens)
    return invalid_input(f.path() + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                         " entries, tokenizer.ggml.tokens " + std::to_string(num_tokens));
  return types;
}

Result<json> byte_level_tokenizer(const GgufFile& f, const std::vector<std::string>& tokens) {
  std::string pre = "default";
  if (f.get("tokenizer.ggml.pre")) {
    TROUPE_ASSIGN_OR_RETURN(pre, f.get_string("tokenizer.ggml.pre"));
  }
  const PreTokenizer* p = nullptr;
  for (const auto& t : pre_tokenizers())
    if (pre == t.name) p = &t;
  if (!p) {
    std::string known;
    for (const auto& t : pre_tokenizers()) known += std::string(known.empty() ? "" : ", ") + t.name;
    return invalid_input(f.path() + ": tokenizer.ggml.pre \"" + pre + "\" is not supported (" + known + ")");
  }
  json steps = json::array();
  for (const char* s : p->splits) steps.push_back(split_step(s));
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});

  TROUPE_ASSIGN_OR_RETURN(const std::vector<int64_t> types, token_types(f, tokens.size()));
  std::vector<std::string> merges;
  if (f.get("tokenizer.ggml.merges")) {
    TROUPE_ASSIGN_OR_RETURN(merges, f.get_strings("tokenizer.ggml.merges"));
  }

  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab[tokens[i]] = static_cast<int64_t>(i);
    const int64_t type = types.empty() ? 1 : types[i];
    if (type == 3 || type == 4)  // control tokens are special; user-defined ones are matched whole too
      added.push_back({{"id", static_cast<int64_t>(i)}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", type == 3}});
  }
  json merges_json = json::array();
  for (const auto& m : merges) merges_json.push_back(m);
  const json pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", steps}};
  const json decoder = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  return bpe_tokenizer_json(added, pre_tokenizer, decoder, vocab, merges_json, json(nullptr), false);
}

// Code points of a UTF-8 string, each as its own string (the split points of a SentencePiece piece).
std::vector<std::string> code_points(const std::string& t) {
  std::vector<std::string> out;
  for (size_t i = 0; i < t.size();) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > t.size()) n = 1;
    out.push_back(t.substr(i, n));
    i += n;
  }
  return out;
}

// A `llama` (SentencePiece) vocabulary as tokenizer.json: BPE with byte_fallback and a Metaspace
// pre-tokenizer, as transformers' LlamaTokenizer builds it. The file has no merges: they are every
// split of a token into two tokens, best merged-token score first (transformers' generate_merges).
Result<json> sentencepiece_tokenizer(const GgufFile& f, const std::vector<std::string>& tokens) {
  TROUPE_ASSIGN_OR_RETURN(auto scores, f.get_floats("tokenizer.ggml.scores"));
  if (scores.size() != tokens.size())
    return invalid_input(f.path() + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) + " entries, tokenizer.ggml.tokens " +
                         std::to_string(tokens.size()));
  TROUPE_ASSIGN_OR_RETURN(const std::vector<int64_t> types, token_types(f, tokens.size()));
  bool add_space_prefix = true;
  if (f.get("tokenizer.ggml.add_space_prefix")) {
    TROUPE_ASSIGN_OR_RETURN(add_space_prefix, f.get_bool("tokenizer.ggml.add_space_prefix"));
  }
  std::map<std::string, int64_t> vocab_ids;  // first id of each token
  std::vector<size_t> order;                 // first occurrences, in file order
  for (size_t i = 0; i < tokens.size(); ++i)
    if (vocab_ids.emplace(tokens[i], static_cast<int64_t>(i)).second) order.push_back(i);
  struct Merge {
    std::string l, r;
    double score;
    size_t ll, lr;  // lengths in code points
  };
  std::vector<Merge> merges;
  for (size_t i : order) {
    const auto cps = code_points(tokens[i]);
    std::vector<Merge> local;
    std::string l;
    for (size_t k = 1; k < cps.size(); ++k) {
      l += cps[k - 1];
      std::string r;
      for (size_t q = k; q < cps.size(); ++q) r += cps[q];
      if (vocab_ids.count(l) && vocab_ids.count(r)) local.push_back({l, r, scores[i], k, cps.size() - k});
    }
    std::stable_sort(local.begin(), local.end(), [&](const Merge& a, const Merge& b) {
      return std::pair(vocab_ids[a.l], vocab_ids[a.r]) < std::pair(vocab_ids[b.l], vocab_ids[b.r]);
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tuple(a.score, a.ll, a.lr) > std::tuple(b.score, b.ll, b.lr);
  });
  json vocab = json::object(), added = json::array(), merges_json = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab[tokens[i]] = static_cast<int64_t>(i);
    const int64_t type = types.empty() ? 1 : types[i];
    if (type == 2 || type == 3 || type == 4)  // unknown and control tokens are special; user-defined ones added
      added.push_back({{"id", static_cast<int64_t>(i)}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", type != 4}});
  }
  for (const auto& m : merges) merges_json.push_back(json::array({m.l, m.r}));
  std::string unk;
  if (f.get("tokenizer.ggml.unknown_token_id")) {
    TROUPE_ASSIGN_OR_RETURN(int64_t u, f.get_int("tokenizer.ggml.unknown_token_id"));
    if (u >= 0 && u < static_cast<int64_t>(tokens.size())) unk = tokens[static_cast<size_t>(u)];
  }
  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                               {{"type", "ByteFallback"}}, {{"type", "Fuse"}}});
  if (add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  const json pre_tokenizer = {{"type", "Metaspace"},
                               {"replacement", "\u2581"},
                               {"prepend_scheme", add_space_prefix ? "first" : "never"},
                               {"split", false}};
  return bpe_tokenizer_json(added, pre_tokenizer, {{"type", "Sequence"}, {"decoders", decoders}}, vocab, merges_json,
                            unk.empty() ? json(nullptr) : json(unk), true);
}

// The HF name of blk.N.<part> (weights and biases).
const std::vector<std::pair<std::string, std::string>>& block_parts() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},   {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},        {"ffn_down", "mlp.down_proj"},
      {"attn_norm", "input_layernorm"},    {"ffn_norm", "post_attention_layernorm"},
  };
  return table;
}

// The GGUF architectures troupe imports and how their tensors differ: llama.cpp permutes llama's
// q/k rows for its interleaved rotary layout (undone here); qwen2 and qwen3 use the rotate-half
// layout and are stored as in the checkpoint; qwen2 adds q/k/v biases, qwen3 per-head q/k RMSNorm.
struct GgufArchitecture {
  const char* name;
  const char* hf_architecture;
  bool permuted_qk, qkv_bias, qk_norm;
};

const GgufArchitecture* gguf_architecture(const std::string& arch) {
  static const GgufArchitecture table[] = {
      {"llama", "LlamaForCausalLM", true, false, false},
      {"qwen2", "Qwen2ForCausalLM", false, true, false},
      {"qwen3", "Qwen3ForCausalLM", false, false, true},
  };
  for (const auto& a : table)
    if (arch == a.name) return &a;
  return nullptr;
}

Result<int64_t> positive(const GgufFile& f, const std::string& key) {
  TROUPE_ASSIGN_OR_RETURN(int64_t v, f.get_int(key));
  if (v <= 0) return invalid_input(f.path() + ": metadata key '" + key + "' must be positive (got " + std::to_string(v) + ")");
  return v;
}

Result<int64_t> positive_or(const GgufFile& f, const std::string& key, int64_t fallback) {
  if (!f.get(key)) return fallback;
  return positive(f, key);
}

Result<double> float_or(const GgufFile& f, const std::string& key, double fallback) {
  if (!f.get(key)) return fallback;
  return f.get_float(key);
}

std::string token_or_null(const std::vector<std::string>& tokens, int64_t id) {
  return id >= 0 && id < static_cast<int64_t>(tokens.size()) ? tokens[static_cast<size_t>(id)] : std::string();
}

Status write_json(const fs::path& p, const json& j) {
  std::ofstream out(p, std::ios::trunc);
  out << j.dump(2) << "\n";
  if (!out) return invalid_input(p.string() + ": cannot write");
  return {};
}

}  // namespace

std::string hf_name_from_gguf(const std::string& n) {
  if (n == "token_embd.weight") return "model.embed_tokens.weight";
  if (n == "output_norm.weight") return "model.norm.weight";
  if (n == "output.weight") return "lm_head.weight";
  static const std::regex blk(R"(blk\.(\d+)\.([a-z_]+)\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(n, m, blk)) return "";
  for (const auto& [part, hf] : block_parts())
    if (m[2] == part) return "model.layers." + m[1].str() + "." + hf + "." + m[3].str();
  return "";
}

Result<Tensor> unpermute_qk(const Tensor& t, int64_t heads, const std::string& what) {
  if (t.shape.empty() || heads <= 0 || t.shape[0] % heads != 0 || (t.shape[0] / heads) % 2 != 0)
    return invalid_input(what + ": " + shape_string(t.shape) + " rows are not " + std::to_string(heads) + " heads of an even head_dim");
  const int64_t D = t.shape[0] / heads;
  const size_t cols = t.data.size() / static_cast<size_t>(t.shape[0]);
  Tensor out{t.shape, std::vector<float>(t.data.size())};
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < D / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const size_t src = static_cast<size_t>(h * D + 2 * i + j), dst = static_cast<size_t>(h * D + j * (D / 2) + i);
        std::copy_n(t.data.begin() + static_cast<std::ptrdiff_t>(src * cols), cols,
                    out.data.begin() + static_cast<std::ptrdiff_t>(dst * cols));
      }
  return out;
}

namespace {

// The model's shape from the GGUF metadata (and token_embd.weight's rows, the vocabulary).
struct GgufShape {
  int64_t C = 0, L = 0, H = 0, KV = 0, I = 0, ctx = 0, D = 0, V = 0;
  double theta = 0, eps = 0;
};

Result<GgufShape> read_shape(const GgufFile& f, const std::string& arch) {
  const std::string& path = f.path();
  const std::string a = arch + ".";
  GgufShape s;
  TROUPE_ASSIGN_OR_RETURN(s.C, positive(f, a + "embedding_length"));
  TROUPE_ASSIGN_OR_RETURN(s.L, positive(f, a + "block_count"));
  TROUPE_ASSIGN_OR_RETURN(s.H, positive(f, a + "attention.head_count"));
  TROUPE_ASSIGN_OR_RETURN(s.KV, positive_or(f, a + "attention.head_count_kv", s.H));
  TROUPE_ASSIGN_OR_RETURN(s.I, positive(f, a + "feed_forward_length"));
  TROUPE_ASSIGN_OR_RETURN(s.ctx, positive_or(f, a + "context_length", 2048));
  TROUPE_ASSIGN_OR_RETURN(s.D, positive_or(f, a + "attention.key_length", s.C / s.H));
  TROUPE_ASSIGN_OR_RETURN(int64_t rot, positive_or(f, a + "rope.dimension_count", s.D));
  TROUPE_ASSIGN_OR_RETURN(s.theta, float_or(f, a + "rope.freq_base", 10000.0));
  TROUPE_ASSIGN_OR_RETURN(s.eps, float_or(f, a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (rot != s.D)
    return invalid_input(path + ": " + a + "rope.dimension_count " + std::to_string(rot) + " differs from head_dim " + std::to_string(s.D) +
                         " (partial rotary embeddings are not supported)");
  if (s.H % s.KV != 0) return invalid_input(path + ": head_count " + std::to_string(s.H) + " is not a multiple of head_count_kv " + std::to_string(s.KV));

  const GgufTensorInfo* embd = f.find("token_embd.weight");
  if (!embd || embd->ne.size() != 2) return invalid_input(path + ": missing 2-D tensor 'token_embd.weight'");
  s.V = embd->ne[1];
  if (embd->ne[0] != s.C)
    return invalid_input(path + ": token_embd.weight has rows of " + std::to_string(embd->ne[0]) + ", embedding_length is " + std::to_string(s.C));
  if (f.get(a + "vocab_size")) {
    TROUPE_ASSIGN_OR_RETURN(int64_t v, f.get_int(a + "vocab_size"));
    if (v != s.V)
      return invalid_input(path + ": " + a + "vocab_size " + std::to_string(v) + " differs from token_embd.weight's " + std::to_string(s.V) + " rows");
  }
  return s;
}

// Every tensor a model of this shape has (HF names) and its shape.
std::map<std::string, std::vector<int64_t>> expected_tensors(const GgufShape& s, const GgufArchitecture& spec) {
  const int64_t C = s.C, H = s.H, KV = s.KV, D = s.D, I = s.I, V = s.V;
  std::map<std::string, std::vector<int64_t>> expected = {{"model.embed_tokens.weight", {V, C}}, {"model.norm.weight", {C}},
                                                          {"lm_head.weight", {V, C}}};
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expected[p + "self_attn.q_proj.weight"] = {H * D, C};
    expected[p + "self_attn.k_proj.weight"] = {KV * D, C};
    expected[p + "self_attn.v_proj.weight"] = {KV * D, C};
    expected[p + "self_attn.o_proj.weight"] = {C, H * D};
    expected[p + "mlp.gate_proj.weight"] = {I, C};
    expected[p + "mlp.up_proj.weight"] = {I, C};
    expected[p + "mlp.down_proj.weight"] = {C, I};
    expected[p + "input_layernorm.weight"] = {C};
    expected[p + "post_attention_layernorm.weight"] = {C};
    if (spec.qkv_bias) {
      expected[p + "self_attn.q_proj.bias"] = {H * D};
      expected[p + "self_attn.k_proj.bias"] = {KV * D};
      expected[p + "self_attn.v_proj.bias"] = {KV * D};
    }
    if (spec.qk_norm) {
      expected[p + "self_attn.q_norm.weight"] = {D};
      expected[p + "self_attn.k_norm.weight"] = {D};
    }
  }
  return expected;
}

// Tensors: every one mapped, shape-checked against the config, q/k un-permuted; none missing but a
// tied lm_head.
Status import_tensors(const GgufFile& f, const std::string& arch, const GgufArchitecture& spec, const GgufShape& s,
                      ImportedGguf& out) {
  const std::string& path = f.path();
  const auto expected = expected_tensors(s, spec);
  for (const auto& info : f.tensors()) {
    if (info.name == "rope_freqs.weight") continue;  // llama.cpp's precomputed frequencies; the config has rope_scaling
    const std::string hf = hf_name_from_gguf(info.name);
    auto e = expected.find(hf);
    if (hf.empty() || e == expected.end())
      return invalid_input(path + ": tensor '" + info.name + "' has no place in a " + arch + " model of " + std::to_string(s.L) + " layers");
    if (info.shape() != e->second)
      return invalid_input(path + ": tensor '" + info.name + "' has shape " + shape_string(info.shape()) + ", the metadata implies " +
                           shape_string(e->second));
    TROUPE_ASSIGN_OR_RETURN(Tensor t, f.read(info.name));
    if (spec.permuted_qk && hf.ends_with("self_attn.q_proj.weight")) {
      TROUPE_ASSIGN_OR_RETURN(t, unpermute_qk(t, s.H, path + ": tensor '" + info.name + "'"));
    }
    if (spec.permuted_qk && hf.ends_with("self_attn.k_proj.weight")) {
      TROUPE_ASSIGN_OR_RETURN(t, unpermute_qk(t, s.KV, path + ": tensor '" + info.name + "'"));
    }
    out.tensors[hf] = std::move(t);
  }
  const bool tied = !out.tensors.count("lm_head.weight");
  for (const auto& [name, shape] : expected)
    if (!out.tensors.count(name) && !(tied && name == "lm_head.weight"))
      return invalid_input(path + ": missing tensor for '" + name + "'");
  return {};
}

// The special tokens' ids (-1: none).
struct SpecialIds {
  int64_t bos = -1, eos = -1, pad = -1, unk = -1;
};

// tokenizer.json and tokenizer_config.json; the special tokens' ids.
Result<SpecialIds> import_tokenizer(const GgufFile& f, const GgufShape& s, ImportedGguf& out) {
  const std::string& path = f.path();
  const int64_t V = s.V;
  TROUPE_ASSIGN_OR_RETURN(auto tokens, f.get_strings("tokenizer.ggml.tokens"));
  if (static_cast<int64_t>(tokens.size()) != V)
    return invalid_input(path + ": the tokenizer has " + std::to_string(tokens.size()) + " tokens (tokenizer.ggml.tokens) but token_embd.weight has " +
                         std::to_string(V) + " rows (vocabulary size mismatch)");
  TROUPE_ASSIGN_OR_RETURN(std::string tok_model, f.get_string("tokenizer.ggml.model"));
  if (tok_model == "gpt2") {
    TROUPE_ASSIGN_OR_RETURN(out.tokenizer, byte_level_tokenizer(f, tokens));
  } else if (tok_model == "llama") {
    TROUPE_ASSIGN_OR_RETURN(out.tokenizer, sentencepiece_tokenizer(f, tokens));
  } else {
    return invalid_input(path + ": tokenizer.ggml.model \"" + tok_model +
                         "\" is not supported (troupe imports gpt2 byte-level BPE and llama SentencePiece vocabularies)");
  }

  auto id_of = [&](const std::string& key) -> Result<int64_t> {
    if (!f.get(key)) return int64_t{-1};
    TROUPE_ASSIGN_OR_RETURN(int64_t id, f.get_int(key));
    if (id < 0 || id >= V) return invalid_input(path + ": " + key + " " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(V));
    return id;
  };
  SpecialIds ids;
  TROUPE_ASSIGN_OR_RETURN(ids.bos, id_of("tokenizer.ggml.bos_token_id"));
  TROUPE_ASSIGN_OR_RETURN(ids.eos, id_of("tokenizer.ggml.eos_token_id"));
  TROUPE_ASSIGN_OR_RETURN(ids.pad, id_of("tokenizer.ggml.padding_token_id"));
  TROUPE_ASSIGN_OR_RETURN(ids.unk, id_of("tokenizer.ggml.unknown_token_id"));
  bool add_bos = false, add_eos = false;
  if (f.get("tokenizer.ggml.add_bos_token")) {
    TROUPE_ASSIGN_OR_RETURN(add_bos, f.get_bool("tokenizer.ggml.add_bos_token"));
  }
  if (f.get("tokenizer.ggml.add_eos_token")) {
    TROUPE_ASSIGN_OR_RETURN(add_eos, f.get_bool("tokenizer.ggml.add_eos_token"));
  }

  json& tc = out.tokenizer_config;
  tc = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"add_bos_token", add_bos}, {"add_eos_token", add_eos},
        {"model_max_length", s.ctx}, {"clean_up_tokenization_spaces", false}};
  for (auto [key, id] : {std::pair{"bos_token", ids.bos}, {"eos_token", ids.eos}, {"pad_token", ids.pad}, {"unk_token", ids.unk}}) {
    if (id >= 0) tc[key] = token_or_null(tokens, id);
    else tc[key] = nullptr;
  }
  if (f.get("tokenizer.chat_template")) {
    TROUPE_ASSIGN_OR_RETURN(tc["chat_template"], f.get_string("tokenizer.chat_template"));
  }
  return ids;
}

// config.json (the HF config of the architecture) and generation_config.json.
Status import_config(const GgufFile& f, const std::string& arch, const GgufArchitecture& spec, const GgufShape& s,
                     const SpecialIds& ids, ImportedGguf& out) {
  const std::string a = arch + ".";
  const bool tied = !out.tensors.count("lm_head.weight");
  json& c = out.config;
  c = {{"architectures", {spec.hf_architecture}},
       {"model_type", arch},
       {"hidden_size", s.C},
       {"intermediate_size", s.I},
       {"num_hidden_layers", s.L},
       {"num_attention_heads", s.H},
       {"num_key_value_heads", s.KV},
       {"head_dim", s.D},
       {"hidden_act", "silu"},
       {"max_position_embeddings", s.ctx},
       {"rms_norm_eps", s.eps},
       {"rope_theta", s.theta},
       {"rope_scaling", nullptr},
       {"vocab_size", s.V},
       {"tie_word_embeddings", tied},
       {"torch_dtype", "float32"}};
  if (arch == "llama") c["mlp_bias"] = false;
  if (arch == "llama" || arch == "qwen3") c["attention_bias"] = false;  // qwen2's q/k/v biases are its family's
  if (arch == "qwen2" || arch == "qwen3") c["use_sliding_window"] = false;
  if (f.get(a + "rope.scaling.type")) {
    TROUPE_ASSIGN_OR_RETURN(std::string type, f.get_string(a + "rope.scaling.type"));
    if (type != "none") {
      json rs = {{"rope_type", type}};
      if (f.get(a + "rope.scaling.factor")) {
        TROUPE_ASSIGN_OR_RETURN(rs["factor"], f.get_float(a + "rope.scaling.factor"));
      }
      if (f.get(a + "rope.scaling.original_context_length")) {
        TROUPE_ASSIGN_OR_RETURN(rs["original_max_position_embeddings"], f.get_int(a + "rope.scaling.original_context_length"));
      }
      c["rope_scaling"] = rs;
    }
  }
  json& g = out.generation_config;
  g = {{"_from_model_config", true}};
  for (auto [key, id] : {std::pair{"bos_token_id", ids.bos}, {"eos_token_id", ids.eos}, {"pad_token_id", ids.pad}})
    if (id >= 0) c[key] = id, g[key] = id;
  return {};
}

// The import table of the file's architecture; an error naming the file for one troupe does not import.
Result<const GgufArchitecture*> supported_architecture(const GgufFile& f, const std::string& arch) {
  const GgufArchitecture* spec = gguf_architecture(arch);
  if (spec == nullptr)
    return invalid_input(f.path() + ": general.architecture \"" + arch + "\" is not supported (troupe imports llama, qwen2 and qwen3)");
  return spec;
}

}  // namespace

Result<ImportedGguf> import_gguf(const GgufFile& f) {
  TROUPE_ASSIGN_OR_RETURN(std::string arch, f.get_string("general.architecture"));
  TROUPE_ASSIGN_OR_RETURN(const GgufArchitecture* spec, supported_architecture(f, arch));
  TROUPE_ASSIGN_OR_RETURN(const GgufShape shape, read_shape(f, arch));
  ImportedGguf out;
  TROUPE_TRY(import_tensors(f, arch, *spec, shape, out));
  TROUPE_ASSIGN_OR_RETURN(const SpecialIds ids, import_tokenizer(f, shape, out));
  TROUPE_TRY(import_config(f, arch, *spec, shape, ids, out));
  return out;
}

Result<nlohmann::json> gguf_config_json(const GgufFile& f) {
  TROUPE_ASSIGN_OR_RETURN(std::string arch, f.get_string("general.architecture"));
  TROUPE_ASSIGN_OR_RETURN(const GgufArchitecture* spec, supported_architecture(f, arch));
  TROUPE_ASSIGN_OR_RETURN(const GgufShape shape, read_shape(f, arch));
  ImportedGguf out;
  if (f.find("output.weight") != nullptr) out.tensors["lm_head.weight"] = Tensor{};  // untied: only its presence counts
  TROUPE_TRY(import_config(f, arch, *spec, shape, SpecialIds{}, out));
  return out.config;
}

Status import_gguf_to_dir(const std::string& gguf_path, const std::string& out_dir, DType dtype) {
  TROUPE_ASSIGN_OR_RETURN(auto file, GgufFile::open(gguf_path));
  TROUPE_ASSIGN_OR_RETURN(auto imported, import_gguf(file));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return invalid_input(out_dir + ": cannot create directory: " + ec.message());
  imported.config["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  const fs::path d(out_dir);
  TROUPE_TRY(write_safetensors((d / "model.safetensors").string(), imported.tensors, {{"format", "pt"}}, dtype));
  TROUPE_TRY(write_json(d / "config.json", imported.config));
  TROUPE_TRY(write_json(d / "tokenizer.json", imported.tokenizer));
  TROUPE_TRY(write_json(d / "tokenizer_config.json", imported.tokenizer_config));
  TROUPE_TRY(write_json(d / "generation_config.json", imported.generation_config));
  return {};
}

Result<std::string> model_dir_for(const std::string& path) {
  if (!path.ends_with(".gguf")) return path;
  return cached_gguf_import(path);
}

Result<std::string> cached_gguf_import(const std::string& gguf_path) {
  std::error_code ec;
  const auto size = fs::file_size(gguf_path, ec);
  if (ec) return invalid_input(gguf_path + ": cannot open GGUF file: " + ec.message());
  struct stat st {};
  const long long mtime = ::stat(gguf_path.c_str(), &st) == 0 ? static_cast<long long>(st.st_mtime) : 0;
  fs::path cache;
  if (const char* c = std::getenv("TROUPE_CACHE"); c && *c) cache = c;
  else if (const char* h = std::getenv("HOME"); h && *h) cache = fs::path(h) / ".cache" / "troupe";
  else cache = fs::temp_directory_path() / "troupe_cache";
  const fs::path dir = cache / "gguf" / (fs::path(gguf_path).stem().string() + "-" + std::to_string(size) + "-" + std::to_string(mtime));
  if (fs::exists(dir / "config.json")) return dir.string();
  const fs::path tmp = dir.string() + ".tmp" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  TROUPE_TRY(import_gguf_to_dir(gguf_path, tmp.string()));
  fs::rename(tmp, dir, ec);
  if (ec && !fs::exists(dir / "config.json")) return invalid_input(dir.string() + ": cannot write the imported model: " + ec.message());
  fs::remove_all(tmp, ec);
  return dir.string();
}

}  // namespace troupe::policy::io
