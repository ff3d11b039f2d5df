// The policy model API that learner/, actors/ and launch/ program against (issue 4 implements it).
// Contract: parameters, gradients and activations each live in one flat fp32 arena laid out from
// one tensor table; gradients mirror parameters (same offsets), so zeroing, all-reduce, clipping,
// AdamW and checkpointing each touch one flat buffer. Training forward/backward run on a packed
// batch (several sequences concatenated, no padding; attention never crosses cu_seqlens).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::policy {

struct ModelConfig;  // sizes, MoE layout, optimizations switches — defined in model_config.h

// One named tensor in an arena: shape and float offset into the flat buffer.
struct TensorSpec {
  std::string name;  // Hugging Face name of the family, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats
  size_t numel() const {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

// A packed training batch: S sequences of lengths L_s concatenated into T tokens.
struct PackedBatch {
  std::vector<int32_t> tokens;      // (T) input ids
  std::vector<int32_t> cu_seqlens;  // (S+1) cumulative starts, cu_seqlens[0]=0, back()=T
  std::vector<int32_t> targets;     // (T) id predicted at each position (-1 = no target, e.g. last token)
};

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  int max_new_tokens = 64;
  std::vector<int32_t> stop_tokens;  // e.g. EOS; the stop token is included in the output
  uint64_t seed = 0;
};

struct Generation {
  std::vector<int32_t> tokens;   // sampled tokens (stop token included when hit)
  std::vector<float> logprobs;   // log-prob of each sampled token under the sampling distribution
  bool stopped = false;          // true when a stop token ended it, false when max_new_tokens did (truncated)
};

}  // namespace troupe::policy
