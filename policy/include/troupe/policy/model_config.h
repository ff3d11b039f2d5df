// The policy model's architecture and its execution options. Architecture field names follow the
// Hugging Face config.json of the supported families where one exists, so config.json maps 1:1;
// the YAML section `policy.model` (a fresh model's architecture) uses the same names. Shape
// letters: V vocab, C d_model, L layers.
#pragma once

#include <string>
#include <vector>

#include "troupe/policy/execution_options.h"

namespace troupe::policy {

// What a checkpoint fixes: shapes, rope, norms, family.
struct ModelArchitecture {
  std::string family = "qwen3_moe";  // "qwen3_moe" (per-head q/k RMSNorm) or "mixtral"
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
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  float router_aux_loss_coef = 0.0f;  // weight of the load-balancing loss (0 = off)
  int max_position_embeddings = 2048;

  bool qk_norm() const { return family == "qwen3_moe"; }
  bool is_moe_layer(int l) const {
    if (num_experts <= 0) return false;
    for (int d : mlp_only_layers)
      if (d == l) return false;
    return true;
  }
};

// What the model is built from: its architecture and how it runs.
struct ModelConfig : ModelArchitecture, ExecutionOptions {};

}  // namespace troupe::policy
