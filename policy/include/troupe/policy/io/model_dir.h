// Model directories (docs/architecture.md, "Model directory"): config.json + model.safetensors (or shards) in
// the Hugging Face layout of Mixtral or Qwen3-MoE, plus a tokenizer. Loading accepts every
// expert-tensor layout transformers writes and returns one canonical set of names (below).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "troupe/base/result.h"
#include "troupe/policy/io/safetensors.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/policy/model_config.h"

namespace troupe::policy::io {

// Canonical tensor names (transformers >= 5 in-memory names, the same for both families):
//   model.embed_tokens.weight (V, C), model.norm.weight (C), lm_head.weight (V, C) unless tied
//   model.layers.{l}.input_layernorm.weight / post_attention_layernorm.weight (C)
//   model.layers.{l}.self_attn.{q,k,v,o}_proj.weight, q_norm/k_norm.weight (D) for qwen3_moe
//   dense layer: model.layers.{l}.mlp.{gate,up}_proj.weight (I, C), mlp.down_proj.weight (C, I)
//   MoE layer:   model.layers.{l}.mlp.gate.weight (E, C) router,
//                model.layers.{l}.mlp.experts.gate_up_proj (E, 2H, C)  [gate rows first, then up]
//                model.layers.{l}.mlp.experts.down_proj (E, C, H)
// On disk these may be per expert (Mixtral block_sparse_moe.experts.{e}.w1/w3/w2, Qwen3
// mlp.experts.{e}.gate_proj/up_proj/down_proj) or fused as above, or fused transposed
// (gate_up (E, C, 2H), down (E, H, C)); all load to the canonical form.

// config.json <-> ModelConfig. Unsupported settings (hidden_act other than silu, attention bias,
// sliding windows, rope scaling) are errors naming the key and the file.
Result<ModelConfig> config_from_hf_json(const nlohmann::json& j, const std::string& file = "config.json");
Result<nlohmann::json> config_to_hf_json(const ModelConfig& c);

// Every canonical tensor the config implies, with its shape, in a fixed order.
std::vector<std::pair<std::string, std::vector<int64_t>>> canonical_tensor_shapes(const ModelConfig& c);

// A contiguous block of every MoE layer's routed experts: [first, first + count); count -1 = every
// expert (the whole model). An expert-parallel learner's block (policy::Model::slice_experts) is
// experts [shard E/shards, (shard+1) E/shards).
struct ExpertRange {
  int first = 0;
  int count = -1;
  bool all() const { return count < 0; }
};

enum class ExpertLayout {
  per_expert,      // what transformers' save_pretrained writes by default (loadable by 4.x and 5.x)
  fused,           // gate_up_proj (E, 2H, C), down_proj (E, C, H): save_pretrained(save_original_format=False)
};

struct ModelDir {
  std::string path;
  ModelConfig config;
  nlohmann::json hf_config;  // config.json as read
  TensorMap tensors;         // canonical names, fp32, every shape checked against the config
  std::unique_ptr<Tokenizer> tokenizer;  // null when the directory has none
  int32_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;  // config.json, else tokenizer's
  std::string chat_template;  // Jinja text (chat_template.h: read_chat_template_dir); empty when none
};

// Loads config.json, the weights (model.safetensors or model.safetensors.index.json, or a sharded
// learner's checkpoint's shards.json and shards: sharded_weights.h) and the
// tokenizer if present. Errors name the file, and the tensor where one is at fault. read_weights
// false: everything but the weights (tensors stays empty; a .gguf's quantized load reads its own).
Result<ModelDir> load_model_dir(const std::string& path, bool read_weights = true);

// The canonical weights of the model directory `path` whose config is `c` (load_model_dir's
// tensors), with experts: only that block of every MoE layer's routed experts (the canonical expert
// tensors hold count experts). A safetensors directory is then read on demand: the other experts'
// bytes (per-expert tensors, or the fused tensors' other rows) are never read. A sharded learner's
// checkpoint (shards.json) is read whole first.
Result<TensorMap> read_model_weights(const std::string& path, const ModelConfig& c, ExpertRange experts = {});

// Writes config.json, model.safetensors (Hugging Face layout of config.family) and the tokenizer
// (if given) into path, creating it. `tensors` are canonical; every one the config implies must be there.
Status save_model_dir(const std::string& path, const ModelConfig& config, const TensorMap& tensors,
                      const Tokenizer* tokenizer, ExpertLayout layout = ExpertLayout::per_expert,
                      int32_t bos_token_id = -1, int32_t eos_token_id = -1, int32_t pad_token_id = -1);
// save_model_dir without the weights: config.json (with the bos/eos/pad ids) and the tokenizer (a
// sharded learner's checkpoint, whose weights are in its shards: sharded_weights.h).
Status save_model_dir_meta(const std::string& path, const ModelConfig& config, const Tokenizer* tokenizer,
                           int32_t bos_token_id = -1, int32_t eos_token_id = -1, int32_t pad_token_id = -1);

// Converts a file's tensor names to canonical ones (exposed for tests); with experts, that block of
// the routed experts only (read_model_weights).
Result<TensorMap> canonicalize_tensors(const ModelConfig& c, const WeightSource& w, ExpertRange experts = {});
// Same for tensors in memory under on-disk names; `what` names them in messages.
Result<TensorMap> canonicalize_tensors(const ModelConfig& c, const TensorMap& disk_named, const std::string& what,
                                       ExpertRange experts = {});
// Canonical names -> on-disk names of the family in `layout`; with experts, canonical expert
// tensors of that block (count experts), named by their expert numbers in the whole model.
Result<TensorMap> hf_tensors_from_canonical(const ModelConfig& c, const TensorMap& canonical, ExpertLayout layout,
                                            ExpertRange experts = {});

}  // namespace troupe::policy::io
