// The policy model's architecture and its execution options. Architecture field names follow the
// Hugging Face config.json of the supported families (llama, qwen2, qwen3, qwen2_moe, qwen3_moe,
// mixtral) where one exists, so config.json maps 1:1; the YAML section `policy.model` (a fresh
// model's architecture) uses the same names. Shape letters: V vocab, C d_model, L layers.
#pragma once

#include <string>
#include <vector>

#include "troupe/base/enum_names.h"
#include "troupe/base/result.h"
#include "troupe/policy/execution_options.h"

namespace troupe::policy {

// The supported families (config.json model_type, YAML policy.model.family); the names below.
enum class ModelFamily { llama, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral };
// RoPE frequency scaling (config.json rope_scaling / rope_parameters rope_type): default (none),
// linear, llama3.
enum class RopeType { unscaled, linear, llama3 };
inline bool is_moe_family(ModelFamily f) {
  return f == ModelFamily::mixtral || f == ModelFamily::qwen3_moe || f == ModelFamily::qwen2_moe;
}

// What a checkpoint fixes: shapes, rope, norms, family.
struct ModelArchitecture {
  // "llama", "qwen2" (q/k/v biases), "qwen3" (per-head q/k RMSNorm), "qwen2_moe" (gated shared
  // expert), "qwen3_moe" (per-head q/k RMSNorm) or "mixtral". Dense families have num_experts 0.
  ModelFamily family = ModelFamily::qwen3_moe;
  int vocab_size = 256;              // V
  int hidden_size = 128;             // C
  int num_hidden_layers = 4;         // L
  int num_attention_heads = 4;
  int num_key_value_heads = 2;       // GQA: num_attention_heads % num_key_value_heads == 0
  int head_dim = 32;
  int intermediate_size = 256;       // hidden size of dense SwiGLU layers
  int num_experts = 8;               // E (Mixtral: num_local_experts)
  int num_experts_per_tok = 2;       // K
  int moe_intermediate_size = 128;   // H of each routed expert (Mixtral: intermediate_size)
  bool norm_topk_prob = true;        // renormalize top-k router weights (Mixtral always does)
  int shared_expert_intermediate_size = 0;  // 0 = no shared expert
  std::vector<int> mlp_only_layers;  // layers that use a dense SwiGLU instead of MoE (e.g. {0})
  float rope_theta = 10000.0f;
  // RoPE frequency scaling (config.json rope_scaling / rope_parameters): "default", "linear"
  // (inv_freq / rope_factor) or "llama3" (Llama 3.1's band-wise scaling with the three below).
  RopeType rope_type = RopeType::unscaled;
  float rope_factor = 1.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int rope_original_max_position_embeddings = 8192;
  bool qkv_bias = false;     // q_proj/k_proj/v_proj have biases (qwen2, qwen2_moe; llama attention_bias)
  bool o_proj_bias = false;  // o_proj has a bias (llama/qwen3 attention_bias)
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  float router_aux_loss_coef = 0.0f;  // weight of the load-balancing loss (0 = off)
  int max_position_embeddings = 2048;

  bool qk_norm() const { return family == ModelFamily::qwen3_moe || family == ModelFamily::qwen3; }
  // qwen2_moe scales the shared expert by sigmoid(shared_expert_gate . x) per token.
  bool shared_expert_gated() const { return family == ModelFamily::qwen2_moe && shared_expert_intermediate_size > 0; }
  bool is_moe_layer(int l) const {
    if (num_experts <= 0) return false;
    for (int d : mlp_only_layers)
      if (d == l) return false;
    return true;
  }
};

// LoRA (YAML policy.lora): low-rank adapters beside the frozen linear layers they target, PEFT's
// layout and defaults (policy/README.md, "LoRA"). The module kinds a target names: attention q/k/v/o
// projections, the MLP's gate/up/down projections (dense layers and the gated shared expert),
// routed experts, or all of them (all_linear, PEFT's "all-linear": never the LM head).
enum class LoraTarget { q, k, v, o, gate, up, down, experts, all_linear };
// How A is drawn (B is always zero, so a fresh adapter leaves the model unchanged):
// kaiming_uniform (YAML "default", PEFT's init_lora_weights=True: U(-1/sqrt(in), 1/sqrt(in)), i.e.
// kaiming-uniform with a = sqrt(5)) or gaussian (N(0, 1/r)).
enum class LoraInit { kaiming_uniform, gaussian };

struct LoraConfig {
  int rank = 0;                 // r; 0 = no adapters (the whole model trains)
  float alpha = 8.0f;           // lora_alpha (PEFT's default)
  float dropout = 0.0f;         // lora_dropout on the low-rank path's input, training forwards only
  std::vector<LoraTarget> targets{LoraTarget::all_linear};
  LoraInit init = LoraInit::kaiming_uniform;
  bool use_rslora = false;      // scale alpha / sqrt(r) instead of alpha / r
  float lr = 0.0f;              // the adapters' learning rate (0 = optimizer.lr); the learner reads it
  bool enabled() const { return rank > 0; }
  float scale() const;          // alpha / r, or alpha / sqrt(r) with use_rslora
  bool targets_kind(LoraTarget t) const;  // t is listed, or all_linear is
};

// What the model is built from: its architecture, how it runs, and its adapters.
struct ModelConfig : ModelArchitecture, ExecutionOptions {
  LoraConfig lora;
};

// Checks a LoRA configuration against an architecture; errors name the YAML key
// (policy.lora.rank, .alpha, .dropout, .targets) and the value.
Status validate_lora(const LoraConfig& lora, const ModelArchitecture& arch);

}  // namespace troupe::policy

namespace troupe {
template <>
struct EnumNames<policy::ModelFamily> {
  using F = policy::ModelFamily;
  static constexpr std::pair<std::string_view, F> table[] = {{"llama", F::llama},         {"qwen2", F::qwen2},
                                                             {"qwen3", F::qwen3},         {"qwen2_moe", F::qwen2_moe},
                                                             {"qwen3_moe", F::qwen3_moe}, {"mixtral", F::mixtral}};
};
template <>
struct EnumNames<policy::LoraTarget> {
  using T = policy::LoraTarget;
  static constexpr std::pair<std::string_view, T> table[] = {
      {"q", T::q},       {"k", T::k},       {"v", T::v},       {"o", T::o},         {"gate", T::gate},
      {"up", T::up},     {"down", T::down}, {"experts", T::experts}, {"all_linear", T::all_linear}};
};
template <>
struct EnumNames<policy::LoraInit> {
  using I = policy::LoraInit;
  static constexpr std::pair<std::string_view, I> table[] = {{"default", I::kaiming_uniform}, {"gaussian", I::gaussian}};
};
template <>
struct EnumNames<policy::RopeType> {
  using R = policy::RopeType;
  static constexpr std::pair<std::string_view, R> table[] = {{"default", R::unscaled}, {"linear", R::linear}, {"llama3", R::llama3}};
};
}  // namespace troupe
