// SmolLM2-135M's architecture (Llama layout: dense SwiGLU layers, no q/k norm, tied embeddings),
// the real-model shape the policy and weight_sync benches time with random weights.
#pragma once

#include "troupe/policy/model_config.h"

namespace troupe::bench {

inline policy::ModelArchitecture smollm2_135m_architecture() {
  policy::ModelArchitecture a;
  a.family = policy::ModelFamily::llama;
  a.vocab_size = 49152;
  a.hidden_size = 576;
  a.num_hidden_layers = 30;
  a.num_attention_heads = 9;
  a.num_key_value_heads = 3;
  a.head_dim = 64;
  a.intermediate_size = 1536;
  a.num_experts = 0;
  a.num_experts_per_tok = 0;
  a.moe_intermediate_size = 0;
  a.rope_theta = 100000.0f;
  a.rms_norm_eps = 1e-5f;
  a.tie_word_embeddings = true;
  a.max_position_embeddings = 8192;
  return a;
}

}  // namespace troupe::bench
