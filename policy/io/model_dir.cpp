// Model directories: config.json mapping for Llama, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE and Mixtral, and the
// tensor-name mapping between the on-disk layouts transformers writes and troupe's canonical names.
// Invariant: what load_model_dir returns has exactly canonical_tensor_shapes(config), each shape checked.
#include "troupe/policy/io/model_dir.h"

#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/sharded_weights.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

namespace troupe::policy::io {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Error cfg_error(const std::string& file, const std::string& what) { return invalid_input(file + ": " + what); }

// Reads an optional key; wrong type is an error naming the key.
template <class T>
Status get_opt(const json& j, const char* key, T& out, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return {};
  try {
    out = j[key].get<T>();
  } catch (const json::exception&) {
    return cfg_error(file, std::string("key \"") + key + "\" has the wrong type (" + j[key].dump() + ")");
  }
  return {};
}

template <class T>
Status get_req(const json& j, const char* key, T& out, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return cfg_error(file, std::string("missing key \"") + key + "\"");
  return get_opt(j, key, out, file);
}

std::string layer(int l) { return "model.layers." + std::to_string(l) + "."; }

}  // namespace

namespace {

// rope_scaling (transformers < 5) or rope_parameters (>= 5): type and its parameters.
Status read_rope(const json& j, ModelConfig& c, const std::string& file) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const json& r = j[key];
    const std::string k = key;
    if (!r.is_object()) return cfg_error(file, "\"" + k + "\" must be an object");
    const std::string where = file + ": \"" + k + "\"";  // errors of its keys name the object too
    std::string type = "default";
    if (r.contains("rope_type") && r["rope_type"].is_string()) type = r["rope_type"].get<std::string>();
    if (r.contains("type") && r["type"].is_string()) type = r["type"].get<std::string>();
    const auto rope = enum_from_name<RopeType>(type);
    if (!rope)
      return cfg_error(file, "\"" + k + "\": rope_type \"" + type +
                                 "\" is not supported (troupe implements default, linear and llama3 RoPE)");
    TROUPE_TRY(get_opt(r, "rope_theta", c.rope_theta, where));
    float partial = 1.0f;
    TROUPE_TRY(get_opt(r, "partial_rotary_factor", partial, where));
    if (partial != 1.0f)
      return cfg_error(file, "\"" + k + "\": partial_rotary_factor " + std::to_string(partial) +
                                 " is not supported (only 1)");
    c.rope_type = *rope;
    if (*rope == RopeType::unscaled) continue;
    TROUPE_TRY(get_req(r, "factor", c.rope_factor, where));
    if (!(c.rope_factor > 0)) return cfg_error(file, "\"" + k + "\": factor must be > 0");
    if (*rope == RopeType::llama3) {
      TROUPE_TRY(get_req(r, "low_freq_factor", c.rope_low_freq_factor, where));
      TROUPE_TRY(get_req(r, "high_freq_factor", c.rope_high_freq_factor, where));
      c.rope_original_max_position_embeddings = c.max_position_embeddings;
      TROUPE_TRY(
          get_opt(r, "original_max_position_embeddings", c.rope_original_max_position_embeddings, where));
      if (!(c.rope_low_freq_factor > 0) || !(c.rope_high_freq_factor > c.rope_low_freq_factor))
        return cfg_error(file, "\"" + k + "\": llama3 RoPE needs 0 < low_freq_factor < high_freq_factor");
    }
  }
  return {};
}

// Refuses what would make transformers attend to a window instead of the whole causal context.
Status check_full_attention(const json& j, const ModelConfig& c, const std::string& file) {
  bool use_sw = c.family == ModelFamily::mixtral;  // Mixtral has no switch: a non-null sliding_window applies
  TROUPE_TRY(get_opt(j, "use_sliding_window", use_sw, file));
  if (use_sw && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    int sw = 0;
    TROUPE_TRY(get_opt(j, "sliding_window", sw, file));
    if (sw > 0 && sw < c.max_position_embeddings)
      return cfg_error(file, "sliding_window " + std::to_string(sw) +
                                 " with use_sliding_window true is not supported " +
                                 "(troupe attends to the whole causal context)");
  }
  if (j.contains("layer_types") && j["layer_types"].is_array() && !use_sw)
    return {};  // transformers makes every layer full attention without use_sliding_window
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const auto& t : j["layer_types"])
      if (!t.is_string() || t.get<std::string>() != "full_attention")
        return cfg_error(file,
                         "layer_types entry " + t.dump() + " is not supported (only \"full_attention\")");
  return {};
}

}  // namespace

Result<ModelConfig> config_from_hf_json(const json& j, const std::string& file) {
  if (!j.is_object()) return cfg_error(file, "expected a JSON object");
  std::string model_type;
  TROUPE_TRY(get_req(j, "model_type", model_type, file));
  const auto family = enum_from_name<ModelFamily>(model_type);
  if (!family)
    return cfg_error(
        file, "model_type \"" + model_type +
                  "\" is not supported (troupe loads llama, qwen2, qwen3, qwen2_moe, qwen3_moe and mixtral)");
  using F = ModelFamily;
  const F fam = *family;
  const bool moe = is_moe_family(fam);
  ModelConfig c;
  c.family = fam;
  TROUPE_TRY(get_req(j, "vocab_size", c.vocab_size, file));
  TROUPE_TRY(get_req(j, "hidden_size", c.hidden_size, file));
  TROUPE_TRY(get_req(j, "num_hidden_layers", c.num_hidden_layers, file));
  TROUPE_TRY(get_req(j, "num_attention_heads", c.num_attention_heads, file));
  c.num_key_value_heads = c.num_attention_heads;
  TROUPE_TRY(get_opt(j, "num_key_value_heads", c.num_key_value_heads, file));
  if (c.num_attention_heads <= 0 || c.hidden_size <= 0 || c.vocab_size <= 0 || c.num_hidden_layers <= 0)
    return cfg_error(file, "vocab_size, hidden_size, num_hidden_layers and num_attention_heads must be positive");
  // transformers' defaults: Qwen3Config has head_dim 128, the others hidden_size / num_attention_heads.
  c.head_dim = fam == F::qwen3 ? 128 : c.hidden_size / c.num_attention_heads;
  TROUPE_TRY(get_opt(j, "head_dim", c.head_dim, file));
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    return cfg_error(file, "num_attention_heads (" + std::to_string(c.num_attention_heads) +
                               ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
  TROUPE_TRY(get_opt(j, "max_position_embeddings", c.max_position_embeddings, file));
  TROUPE_TRY(get_opt(j, "rms_norm_eps", c.rms_norm_eps, file));
  TROUPE_TRY(get_opt(j, "tie_word_embeddings", c.tie_word_embeddings, file));
  if (moe) {
    TROUPE_TRY(get_opt(j, "router_aux_loss_coef", c.router_aux_loss_coef, file));
    TROUPE_TRY(get_req(j, "num_experts_per_tok", c.num_experts_per_tok, file));
  }

  // rope: transformers < 5 writes rope_theta (+ rope_scaling); >= 5 writes rope_parameters.
  c.rope_theta = fam == F::mixtral ? 1e6f : 10000.0f;
  TROUPE_TRY(get_opt(j, "rope_theta", c.rope_theta, file));
  TROUPE_TRY(read_rope(j, c, file));

  std::string act = "silu";
  TROUPE_TRY(get_opt(j, "hidden_act", act, file));
  if (act != "silu") return cfg_error(file, "hidden_act \"" + act + "\" is not supported (troupe's MLPs are SwiGLU: silu)");
  bool mlp_bias = false;
  TROUPE_TRY(get_opt(j, "mlp_bias", mlp_bias, file));
  if (mlp_bias) return cfg_error(file, "mlp_bias true is not supported (troupe's MLPs have no biases)");
  // Attention biases: llama/qwen3/qwen3_moe attention_bias (q, k, v and o); qwen2 always q/k/v;
  // qwen2_moe qkv_bias (default true); Mixtral none.
  bool attention_bias = false;
  TROUPE_TRY(get_opt(j, "attention_bias", attention_bias, file));
  if (fam == F::llama || fam == F::qwen3 || fam == F::qwen3_moe) {
    c.qkv_bias = c.o_proj_bias = attention_bias;
  } else if (attention_bias) {
    return cfg_error(file, "attention_bias true is not supported for " + model_type + " (transformers' " +
                               model_type + " does not read it)");
  }
  if (fam == F::qwen2) c.qkv_bias = true;
  if (fam == F::qwen2_moe) {
    c.qkv_bias = true;
    TROUPE_TRY(get_opt(j, "qkv_bias", c.qkv_bias, file));
  }
  TROUPE_TRY(check_full_attention(j, c, file));

  if (!moe) {
    c.num_experts = 0;
    c.num_experts_per_tok = 0;
    TROUPE_TRY(get_req(j, "intermediate_size", c.intermediate_size, file));
    if (c.intermediate_size <= 0) return cfg_error(file, "intermediate_size must be positive");
  } else if (fam == F::mixtral) {
    TROUPE_TRY(get_req(j, "num_local_experts", c.num_experts, file));
    TROUPE_TRY(get_req(j, "intermediate_size", c.moe_intermediate_size, file));
    c.intermediate_size = c.moe_intermediate_size;
    c.norm_topk_prob = true;
    // Not in Hugging Face's Mixtral; troupe writes them only when they differ from Mixtral's fixed choice.
    TROUPE_TRY(get_opt(j, "norm_topk_prob", c.norm_topk_prob, file));
    TROUPE_TRY(get_opt(j, "mlp_only_layers", c.mlp_only_layers, file));
    TROUPE_TRY(get_opt(j, "shared_expert_intermediate_size", c.shared_expert_intermediate_size, file));
  } else {
    if (j.contains("num_experts") && !j["num_experts"].is_null()) {
      TROUPE_TRY(get_opt(j, "num_experts", c.num_experts, file));
    } else {
      TROUPE_TRY(get_req(j, "num_local_experts", c.num_experts, file));  // transformers >= 5 spelling
    }
    TROUPE_TRY(get_req(j, "intermediate_size", c.intermediate_size, file));
    TROUPE_TRY(get_req(j, "moe_intermediate_size", c.moe_intermediate_size, file));
    c.norm_topk_prob = false;  // transformers' default for qwen2_moe and qwen3_moe
    TROUPE_TRY(get_opt(j, "norm_topk_prob", c.norm_topk_prob, file));
    int step = 1;
    TROUPE_TRY(get_opt(j, "decoder_sparse_step", step, file));
    if (step <= 0) return cfg_error(file, "decoder_sparse_step must be positive");
    std::vector<int> only;
    TROUPE_TRY(get_opt(j, "mlp_only_layers", only, file));
    // transformers: layer l is sparse iff l not in mlp_only_layers and (l + 1) % step == 0.
    std::set<int> dense(only.begin(), only.end());
    for (int l = 0; l < c.num_hidden_layers; ++l)
      if ((l + 1) % step != 0) dense.insert(l);
    c.mlp_only_layers.assign(dense.begin(), dense.end());
    // Qwen2-MoE always has its (gated) shared expert; Qwen3-MoE has none (troupe reads the key anyway).
    if (fam == F::qwen2_moe)
      TROUPE_TRY(get_req(j, "shared_expert_intermediate_size", c.shared_expert_intermediate_size, file));
    else
      TROUPE_TRY(get_opt(j, "shared_expert_intermediate_size", c.shared_expert_intermediate_size, file));
  }
  for (int l : c.mlp_only_layers)
    if (l < 0 || l >= c.num_hidden_layers)
      return cfg_error(file, "mlp_only_layers names layer " + std::to_string(l) + ", outside 0.." +
                                 std::to_string(c.num_hidden_layers - 1));
  if (moe) {
    if (c.num_experts <= 0 || c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
      return cfg_error(file, "need 0 < num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) +
                                 ") <= number of experts (" + std::to_string(c.num_experts) + ")");
    if (c.moe_intermediate_size <= 0 || c.intermediate_size <= 0)
      return cfg_error(file, "intermediate_size and moe_intermediate_size must be positive");
  }
  if (c.head_dim <= 0) return cfg_error(file, "head_dim must be positive");
  return c;
}

namespace {

const char* architecture_of(ModelFamily family) {
  switch (family) {
    case ModelFamily::llama: return "LlamaForCausalLM";
    case ModelFamily::qwen2: return "Qwen2ForCausalLM";
    case ModelFamily::qwen3: return "Qwen3ForCausalLM";
    case ModelFamily::qwen2_moe: return "Qwen2MoeForCausalLM";
    case ModelFamily::qwen3_moe: return "Qwen3MoeForCausalLM";
    case ModelFamily::mixtral: return "MixtralForCausalLM";
  }
  return "";
}

}  // namespace

Result<json> config_to_hf_json(const ModelConfig& c) {
  using F = ModelFamily;
  const char* arch = architecture_of(c.family);
  const bool attention_bias_family = c.family == F::llama || c.family == F::qwen3 || c.family == F::qwen3_moe;
  if (attention_bias_family && c.qkv_bias != c.o_proj_bias)
    return invalid_input("cannot save a " + enum_string(c.family) +
                         " model with qkv_bias != o_proj_bias (config.json has one attention_bias)");
  if (!attention_bias_family && c.o_proj_bias)
    return invalid_input("cannot save a " + enum_string(c.family) + " model with o_proj_bias");
  if (c.family == F::qwen2 && !c.qkv_bias)
    return invalid_input("cannot save a qwen2 model without q/k/v biases");
  if (c.family == F::mixtral && c.qkv_bias)
    return invalid_input("cannot save a mixtral model with q/k/v biases");
  const bool moe = is_moe_family(c.family);
  json j;
  j["model_type"] = enum_name(c.family);
  j["architectures"] = {arch};
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;  // read by transformers 4.x and converted by 5.x
  if (c.rope_type != RopeType::unscaled) {
    json r = {{"rope_type", enum_name(c.rope_type)}, {"factor", c.rope_factor}};
    if (c.rope_type == RopeType::llama3) {
      r["low_freq_factor"] = c.rope_low_freq_factor;
      r["high_freq_factor"] = c.rope_high_freq_factor;
      r["original_max_position_embeddings"] = c.rope_original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (moe) {
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.router_aux_loss_coef > 0;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
  }
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = "float32";
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  if (c.family == F::mixtral) {
    j["num_local_experts"] = c.num_experts;
    j["intermediate_size"] = c.moe_intermediate_size;
    j["sliding_window"] = nullptr;
    if (!c.norm_topk_prob) j["norm_topk_prob"] = false;       // troupe-only (Mixtral always renormalizes)
    if (!c.mlp_only_layers.empty()) j["mlp_only_layers"] = c.mlp_only_layers;  // troupe-only
  } else {
    j["intermediate_size"] = c.intermediate_size;
    if (attention_bias_family) j["attention_bias"] = c.qkv_bias;
    if (c.family == F::llama) j["mlp_bias"] = false;
    if (c.family == F::qwen2_moe) j["qkv_bias"] = c.qkv_bias;
    if (c.family != F::llama) {
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
    }
    if (moe) {
      j["num_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = c.mlp_only_layers;
    }
  }
  if (moe && (c.shared_expert_intermediate_size > 0 || c.family == F::qwen2_moe))
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  return j;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> canonical_tensor_shapes(const ModelConfig& c) {
  using S = std::vector<int64_t>;
  const int64_t V = c.vocab_size, C = c.hidden_size, D = c.head_dim, E = c.num_experts, H = c.moe_intermediate_size;
  const int64_t I = c.intermediate_size, Hs = c.shared_expert_intermediate_size;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  std::vector<std::pair<std::string, S>> out;
  out.push_back({"model.embed_tokens.weight", {V, C}});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = layer(l);
    out.push_back({p + "input_layernorm.weight", {C}});
    out.push_back({p + "self_attn.q_proj.weight", {nq * D, C}});
    out.push_back({p + "self_attn.k_proj.weight", {nkv * D, C}});
    out.push_back({p + "self_attn.v_proj.weight", {nkv * D, C}});
    out.push_back({p + "self_attn.o_proj.weight", {C, nq * D}});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {nq * D}});
      out.push_back({p + "self_attn.k_proj.bias", {nkv * D}});
      out.push_back({p + "self_attn.v_proj.bias", {nkv * D}});
    }
    if (c.o_proj_bias) out.push_back({p + "self_attn.o_proj.bias", {C}});
    if (c.qk_norm()) {
      out.push_back({p + "self_attn.q_norm.weight", {D}});
      out.push_back({p + "self_attn.k_norm.weight", {D}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {C}});
    if (c.is_moe_layer(l)) {
      out.push_back({p + "mlp.gate.weight", {E, C}});
      out.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * H, C}});
      out.push_back({p + "mlp.experts.down_proj", {E, C, H}});
      if (Hs > 0) {
        out.push_back({p + "mlp.shared_expert.gate_proj.weight", {Hs, C}});
        out.push_back({p + "mlp.shared_expert.up_proj.weight", {Hs, C}});
        out.push_back({p + "mlp.shared_expert.down_proj.weight", {C, Hs}});
        if (c.shared_expert_gated()) out.push_back({p + "mlp.shared_expert_gate.weight", {1, C}});
      }
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {I, C}});
      out.push_back({p + "mlp.up_proj.weight", {I, C}});
      out.push_back({p + "mlp.down_proj.weight", {C, I}});
    }
  }
  out.push_back({"model.norm.weight", {C}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {V, C}});
  return out;
}

namespace {

// (A, B, R) per expert -> transpose of the last two axes.
Tensor transpose_last2(const Tensor& t) {
  const int64_t E = t.shape[0], A = t.shape[1], B = t.shape[2];
  Tensor o{{E, B, A}, std::vector<float>(t.data.size())};
  for (int64_t e = 0; e < E; ++e)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b) o.data[(e * B + b) * A + a] = t.data[(e * A + a) * B + b];
  return o;
}

struct ExpertNames {
  std::string gate, up, down;  // per-expert names with {e} replaced by the expert index
};

ExpertNames per_expert_names(const ModelConfig& c, int l, int e) {
  const std::string p = layer(l);
  if (c.family == ModelFamily::mixtral) {
    const std::string q = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
    return {q + "w1.weight", q + "w3.weight", q + "w2.weight"};
  }
  const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
  return {q + "gate_proj.weight", q + "up_proj.weight", q + "down_proj.weight"};
}

// The canonical name with Mixtral's legacy module path for MoE-block tensors (router, experts,
// shared expert); dense layers keep mlp.
std::string disk_alias(const ModelConfig& c, const std::string& canonical) {
  if (c.family != ModelFamily::mixtral) return canonical;
  const auto pos = canonical.find(".mlp.");
  if (pos == std::string::npos) return canonical;
  const std::string rest = canonical.substr(pos + 5);
  if (!rest.starts_with("gate.") && !rest.starts_with("experts.") && !rest.starts_with("shared_expert")) return canonical;
  return canonical.substr(0, pos) + ".block_sparse_moe." + rest;
}

}  // namespace

namespace {

// What canonicalize reads from: a file (or shards) or tensors already in memory.
struct TensorSource {
  std::function<const std::vector<int64_t>*(const std::string&)> shape_of;  // nullptr when absent
  std::function<Result<Tensor>(const std::string&, const std::vector<int64_t>&)> read;
  // Rows [first, first + count) of the first dimension (a fused expert tensor's block of experts).
  std::function<Result<Tensor>(const std::string&, const std::vector<int64_t>&, int64_t, int64_t)> read_rows;
  std::vector<std::string> names;
  std::function<std::string(const std::string&)> file_of;  // for messages
  std::string describe;
  bool contains(const std::string& n) const { return shape_of(n) != nullptr; }
};

// The block of experts a range names in a config of E experts: [first, first + count).
Result<std::pair<int64_t, int64_t>> expert_block(const ModelConfig& c, ExpertRange experts) {
  const int64_t E = c.num_experts;
  if (experts.all()) return std::pair<int64_t, int64_t>{0, E};
  if (experts.first < 0 || experts.count < 1 || experts.first + experts.count > E)
    return invalid_input("experts [" + std::to_string(experts.first) + ", " +
                         std::to_string(experts.first + experts.count) + ") of a model of num_experts = " +
                         std::to_string(E));
  return std::pair<int64_t, int64_t>{experts.first, experts.count};
}

Result<TensorMap> canonicalize(const ModelConfig& c, const TensorSource& w, ExpertRange experts) {
  TensorMap out;
  std::set<std::string> used;
  const int64_t H = c.moe_intermediate_size, C = c.hidden_size;
  TROUPE_ASSIGN_OR_RETURN(const auto block, expert_block(c, experts));
  const int64_t first = block.first, E = block.second;  // (E: the experts read; all but with a range)
  auto take = [&](const std::string& name, const std::vector<int64_t>& shape) -> Result<Tensor> {
    used.insert(name);
    return w.read(name, shape);
  };
  auto take_block = [&](const std::string& name, const std::vector<int64_t>& shape) -> Result<Tensor> {
    used.insert(name);
    return experts.all() ? w.read(name, shape) : w.read_rows(name, shape, first, E);
  };
  for (auto [name, shape] : canonical_tensor_shapes(c)) {
    const bool gate_up = name.ends_with("mlp.experts.gate_up_proj");
    const bool down = name.ends_with("mlp.experts.down_proj");
    std::string on_disk = w.contains(name) ? name : disk_alias(c, name);
    if (!gate_up && !down) {
      if (!w.contains(on_disk)) {
        if (name == "lm_head.weight") return invalid_input(w.describe + ": missing tensor 'lm_head.weight' (config.json has tie_word_embeddings false)");
        return invalid_input(w.describe + ": missing tensor '" + name + "'");
      }
      TROUPE_ASSIGN_OR_RETURN(out[name], take(on_disk, shape));
      continue;
    }
    if (w.contains(on_disk)) {  // fused on disk: (E, 2H, C) / (E, C, H), or transposed (E, C, 2H) / (E, H, C)
      const std::vector<int64_t>& disk_shape = *w.shape_of(on_disk);
      const std::vector<int64_t> transposed = {shape[0], shape[2], shape[1]};
      if (disk_shape == shape) {
        TROUPE_ASSIGN_OR_RETURN(out[name], take_block(on_disk, shape));
      } else if (disk_shape == transposed) {
        TROUPE_ASSIGN_OR_RETURN(auto t, take_block(on_disk, transposed));
        out[name] = transpose_last2(t);
      } else {
        return invalid_input(w.file_of(on_disk) + ": tensor '" + on_disk + "' has shape " + shape_string(disk_shape) +
                             ", expected " + shape_string(shape) + " (or " + shape_string(transposed) + " transposed)");
      }
      continue;
    }
    // Per expert: stack E matrices (the block's; the other experts' tensors are not read).
    const int l = std::stoi(name.substr(13));  // "model.layers." is 13 characters
    shape[0] = E;
    Tensor t{shape, std::vector<float>(static_cast<size_t>(E) * shape[1] * shape[2])};
    for (int e = 0; e < c.num_experts; ++e) {
      const ExpertNames n = per_expert_names(c, l, e);
      if (e < first || e >= first + E) {
        used.insert({n.gate, n.up, n.down});
        continue;
      }
      if (gate_up) {
        if (!w.contains(n.gate))
          return invalid_input(w.describe + ": missing tensor '" + n.gate + "' (nor the fused '" + on_disk + "')");
        TROUPE_ASSIGN_OR_RETURN(auto g, take(n.gate, {H, C}));
        TROUPE_ASSIGN_OR_RETURN(auto u, take(n.up, {H, C}));
        float* dst = t.data.data() + static_cast<size_t>(e - first) * 2 * H * C;
        std::copy(g.data.begin(), g.data.end(), dst);
        std::copy(u.data.begin(), u.data.end(), dst + H * C);
      } else {
        if (!w.contains(n.down))
          return invalid_input(w.describe + ": missing tensor '" + n.down + "' (nor the fused '" + on_disk + "')");
        TROUPE_ASSIGN_OR_RETURN(auto d, take(n.down, {C, H}));
        std::copy(d.data.begin(), d.data.end(), t.data.data() + static_cast<size_t>(e - first) * C * H);
      }
    }
    out[name] = std::move(t);
  }
  for (const auto& n : w.names) {
    if (used.count(n)) continue;
    // transformers sometimes stores the tied head anyway; rotary caches are recomputed.
    if (n == "lm_head.weight" && c.tie_word_embeddings) continue;
    if (n.ends_with("rotary_emb.inv_freq")) continue;
    return invalid_input(w.file_of(n) + ": unexpected tensor '" + n + "' for the " + enum_string(c.family) +
                         " config in config.json (wrong family, layer count or layout?)");
  }
  return out;
}

}  // namespace

Result<TensorMap> canonicalize_tensors(const ModelConfig& c, const WeightSource& w, ExpertRange experts) {
  TensorSource s;
  s.shape_of = [&w](const std::string& n) -> const std::vector<int64_t>* {
    const SafetensorsEntry* e = w.find(n);
    return e ? &e->shape : nullptr;
  };
  s.read = [&w](const std::string& n, const std::vector<int64_t>& shape) { return w.read(n, shape); };
  s.read_rows = [&w](const std::string& n, const std::vector<int64_t>& shape, int64_t first, int64_t count) {
    return w.read_rows(n, shape, first, count);
  };
  s.names = w.names();
  s.file_of = [&w](const std::string& n) { return w.file_of(n); };
  s.describe = w.describe();
  return canonicalize(c, s, experts);
}

Result<TensorMap> canonicalize_tensors(const ModelConfig& c, const TensorMap& m, const std::string& what,
                                       ExpertRange experts) {
  TensorSource s;
  s.shape_of = [&m](const std::string& n) -> const std::vector<int64_t>* {
    auto it = m.find(n);
    return it == m.end() ? nullptr : &it->second.shape;
  };
  s.read = [&m, &what](const std::string& n, const std::vector<int64_t>& shape) -> Result<Tensor> {
    auto it = m.find(n);
    if (it == m.end()) return invalid_input(what + ": missing tensor '" + n + "'");
    if (it->second.shape != shape)
      return invalid_input(what + ": tensor '" + n + "' has shape " + shape_string(it->second.shape) + ", expected " +
                           shape_string(shape));
    return it->second;
  };
  s.read_rows = [&s](const std::string& n, const std::vector<int64_t>& shape, int64_t first,
                     int64_t count) -> Result<Tensor> {
    TROUPE_ASSIGN_OR_RETURN(Tensor t, s.read(n, shape));
    const size_t row = t.numel() / static_cast<size_t>(shape[0]);
    t.shape[0] = count;
    t.data = std::vector<float>(t.data.begin() + static_cast<std::ptrdiff_t>(first * row),
                                t.data.begin() + static_cast<std::ptrdiff_t>((first + count) * row));
    return t;
  };
  for (const auto& [n, t] : m) s.names.push_back(n);
  s.file_of = [&what](const std::string&) { return what; };
  s.describe = what;
  return canonicalize(c, s, experts);
}

Result<TensorMap> hf_tensors_from_canonical(const ModelConfig& c, const TensorMap& canonical, ExpertLayout layout,
                                            ExpertRange experts) {
  TensorMap out;
  const int64_t H = c.moe_intermediate_size, C = c.hidden_size;
  TROUPE_ASSIGN_OR_RETURN(const auto block, expert_block(c, experts));
  const int64_t first = block.first, E = block.second;
  for (auto [name, shape] : canonical_tensor_shapes(c)) {
    const bool gate_up = name.ends_with("mlp.experts.gate_up_proj");
    const bool down = name.ends_with("mlp.experts.down_proj");
    if (gate_up || down) shape[0] = E;
    auto it = canonical.find(name);
    if (it == canonical.end()) return invalid_input("cannot save: tensor '" + name + "' is missing");
    if (it->second.shape != shape)
      return invalid_input("cannot save: tensor '" + name + "' has shape " + shape_string(it->second.shape) +
                           ", the config implies " + shape_string(shape));
    const Tensor& t = it->second;
    if ((!gate_up && !down) || layout == ExpertLayout::fused) {
      out[name] = t;  // transformers 5 reads fused experts under mlp. for both families
      continue;
    }
    const int l = std::stoi(name.substr(13));
    for (int e = 0; e < E; ++e) {
      const ExpertNames n = per_expert_names(c, l, static_cast<int>(first) + e);
      if (gate_up) {
        const float* src = t.data.data() + static_cast<size_t>(e) * 2 * H * C;
        out[n.gate] = Tensor{{H, C}, std::vector<float>(src, src + H * C)};
        out[n.up] = Tensor{{H, C}, std::vector<float>(src + H * C, src + 2 * H * C)};
      } else {
        const float* src = t.data.data() + static_cast<size_t>(e) * C * H;
        out[n.down] = Tensor{{C, H}, std::vector<float>(src, src + C * H)};
      }
    }
  }
  if (layout == ExpertLayout::per_expert && c.family == ModelFamily::mixtral) {
    TensorMap renamed;
    for (auto& [n, t] : out) renamed[n.find(".experts.") != std::string::npos ? n : disk_alias(c, n)] = std::move(t);
    out = std::move(renamed);
  }
  return out;
}

namespace {

int32_t token_id_from(const json& j, const char* key) {
  if (!j.contains(key)) return -1;
  const json& v = j[key];
  if (v.is_number_integer()) return v.get<int32_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int32_t>();
  return -1;
}

}  // namespace

namespace {

// A block of the experts from a sharded checkpoint: each tensor (or block of rows) read as a range of
// its params buffer, from the files that hold it (each verified when first opened; the files holding
// only the other blocks' experts are never opened).
Result<TensorMap> canonicalize_shard_ranges(const ModelConfig& c, const std::string& dir, ShardManifest m,
                                            ExpertRange experts) {
  ShardRangeReader reader(dir, std::move(m), true);
  const ShardManifest& man = reader.manifest();
  std::map<std::string, const TensorSpec*> by_name;
  TensorSource s;
  for (const TensorSpec& t : man.tensors) {
    by_name[t.name] = &t;
    s.names.push_back(t.name);
  }
  s.shape_of = [&by_name](const std::string& n) -> const std::vector<int64_t>* {
    auto it = by_name.find(n);
    return it == by_name.end() ? nullptr : &it->second->shape;
  };
  s.read_rows = [&](const std::string& n, const std::vector<int64_t>& shape, int64_t first,
                    int64_t count) -> Result<Tensor> {
    auto it = by_name.find(n);
    if (it == by_name.end()) return invalid_input(man.path + ": missing tensor '" + n + "'");
    const TensorSpec& t = *it->second;
    if (t.shape != shape)
      return invalid_input(man.path + ": tensor '" + n + "' has shape " + shape_string(t.shape) + ", expected " +
                           shape_string(shape));
    const size_t row = shape.empty() || shape[0] == 0 ? t.numel() : t.numel() / static_cast<size_t>(shape[0]);
    Tensor out{shape, std::vector<float>(static_cast<size_t>(count) * row)};
    if (!out.shape.empty()) out.shape[0] = count;
    TROUPE_TRY(reader.read(kShardParams, t.offset + static_cast<size_t>(first) * row, out.data));
    return out;
  };
  s.read = [&s](const std::string& n, const std::vector<int64_t>& shape) {
    return s.read_rows(n, shape, 0, shape.empty() ? 1 : shape[0]);
  };
  s.file_of = [&man](const std::string&) { return man.path; };
  s.describe = man.path;
  return canonicalize(c, s, experts);
}

}  // namespace

Result<TensorMap> read_model_weights(const std::string& path, const ModelConfig& c, ExpertRange experts) {
  const fs::path dir(path);
  if (has_shard_manifest(path) && !fs::exists(dir / "model.safetensors") &&
      !fs::exists(dir / "model.safetensors.index.json")) {  // a sharded learner's checkpoint (sharded_weights.h)
    TROUPE_ASSIGN_OR_RETURN(auto m, read_shard_manifest(path));
    if (m.kind != "model")
      return invalid_input(m.path + ": holds LoRA adapters (kind " + m.kind + "), not a whole model's weights");
    if (!experts.all()) return canonicalize_shard_ranges(c, path, std::move(m), experts);
    TROUPE_ASSIGN_OR_RETURN(auto named, read_sharded_tensors(path, m));
    return canonicalize_tensors(c, named, m.path, experts);
  }
  // A block of the experts reads each tensor's bytes as it needs them (the others' are never read).
  TROUPE_ASSIGN_OR_RETURN(auto w, WeightSource::open_dir(path, experts.all() ? DataLoad::eager : DataLoad::on_demand));
  return canonicalize_tensors(c, w, experts);
}

Result<ModelDir> load_model_dir(const std::string& path, bool read_weights) {
  ModelDir d;
  d.path = path;
  const fs::path dir(path);
  if (!fs::is_directory(dir)) return invalid_input(path + ": not a model directory (does not exist or is not a directory)");
  const std::string cfg_path = (dir / "config.json").string();
  std::ifstream in(cfg_path);
  if (!in) return invalid_input(cfg_path + ": missing config.json in model directory " + path);
  try {
    d.hf_config = json::parse(in);
  } catch (const json::exception& e) {
    return invalid_input(cfg_path + ": not valid JSON: " + e.what());
  }
  TROUPE_ASSIGN_OR_RETURN(d.config, config_from_hf_json(d.hf_config, cfg_path));
  if (read_weights) {
    TROUPE_ASSIGN_OR_RETURN(d.tensors, read_model_weights(path, d.config));
  }
  if (fs::exists(dir / kHfTokenizerFile) || fs::exists(dir / kTroupeTokenizerFile)) {
    TROUPE_ASSIGN_OR_RETURN(d.tokenizer, load_tokenizer_dir(path));
  }
  TROUPE_ASSIGN_OR_RETURN(d.chat_template, read_chat_template_dir(path));
  d.bos_token_id = token_id_from(d.hf_config, "bos_token_id");
  d.eos_token_id = token_id_from(d.hf_config, "eos_token_id");
  d.pad_token_id = token_id_from(d.hf_config, "pad_token_id");
  if (d.tokenizer) {
    if (d.bos_token_id < 0) d.bos_token_id = d.tokenizer->bos_id();
    if (d.eos_token_id < 0) d.eos_token_id = d.tokenizer->eos_id();
    if (d.pad_token_id < 0) d.pad_token_id = d.tokenizer->pad_id();
    if (d.tokenizer->vocab_size() > d.config.vocab_size)
      return invalid_input(path + ": tokenizer has " + std::to_string(d.tokenizer->vocab_size()) +
                           " tokens but config.json has vocab_size " + std::to_string(d.config.vocab_size));
  }
  return d;
}

Status save_model_dir(const std::string& path, const ModelConfig& config, const TensorMap& tensors,
                      const Tokenizer* tokenizer, ExpertLayout layout, int32_t bos, int32_t eos, int32_t pad) {
  TROUPE_ASSIGN_OR_RETURN(auto disk, hf_tensors_from_canonical(config, tensors, layout));
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return make_error(ErrorCode::io, path + ": cannot create directory (" + ec.message() + ")");
  TROUPE_TRY(write_safetensors((fs::path(path) / "model.safetensors").string(), disk, {{"format", "pt"}}));
  return save_model_dir_meta(path, config, tokenizer, bos, eos, pad);
}

Status save_model_dir_meta(const std::string& path, const ModelConfig& config, const Tokenizer* tokenizer, int32_t bos,
                           int32_t eos, int32_t pad) {
  TROUPE_ASSIGN_OR_RETURN(auto j, config_to_hf_json(config));
  if (tokenizer) {
    if (bos < 0) bos = tokenizer->bos_id();
    if (eos < 0) eos = tokenizer->eos_id();
    if (pad < 0) pad = tokenizer->pad_id();
  }
  j["bos_token_id"] = bos >= 0 ? json(bos) : json(nullptr);
  j["eos_token_id"] = eos >= 0 ? json(eos) : json(nullptr);
  j["pad_token_id"] = pad >= 0 ? json(pad) : json(nullptr);
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return make_error(ErrorCode::io, path + ": cannot create directory (" + ec.message() + ")");
  const std::string cfg = (fs::path(path) / "config.json").string();
  {
    std::ofstream out(cfg + ".tmp");
    out << j.dump(2) << "\n";
    if (!out) return make_error(ErrorCode::io, cfg + ": write failed");
  }
  fs::rename(cfg + ".tmp", cfg, ec);
  if (ec) return make_error(ErrorCode::io, cfg + ": cannot rename (" + ec.message() + ")");
  if (tokenizer) {
    // A stale tokenizer file of the other kind would shadow this one on load (tokenizer.json wins).
    const bool hf = tokenizer->kind() == "bpe";
    fs::remove(fs::path(path) / (hf ? kTroupeTokenizerFile : kHfTokenizerFile), ec);
    TROUPE_TRY(tokenizer->save(path));
  }
  return {};
}

}  // namespace troupe::policy::io
