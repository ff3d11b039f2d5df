// What a model of a configuration allocates (parameter, adapter and gradient arenas, the training
// activation arena, the offload store, the KV cache), computed by the model's own layout code
// (its tensor table and Model::Impl::arena_layout) without allocating or loading any weight.
// Invariant: every size here is the one Model would allocate for the same configuration.
#pragma once

#include <cstdint>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"
#include "troupe/policy/model_config.h"

namespace troupe::policy {

struct ModelFootprint {
  uint64_t param_floats = 0;       // the parameter arena: every Hugging Face tensor
  uint64_t lora_floats = 0;        // the adapter arena (0 without LoRA); its gradients are as large
  uint64_t moe_sink_floats = 0;    // LoRA on an MoE model: one layer's frozen router/expert gradients
  uint64_t largest_layer_floats = 0;  // the largest decoder layer's parameters
  uint64_t outer_floats = 0;          // the parameters outside the decoder layers (embedding, norm, head)
  uint64_t kv_floats_per_token = 0;   // K and V of one token over every layer: 2 L NKV HD
};

// Checks cfg (validate_model_config, validate_lora) and sizes its arenas.
Result<ModelFootprint> model_footprint(const ModelConfig& cfg);

// The activation memory of one training forward + backward over `tokens` packed tokens whose
// longest sequence is `max_seqlen` long, on backend `be`, with cfg's activation checkpointing and
// offload (what Model::forward_train carves).
struct TrainingActivations {
  uint64_t arena_floats = 0;    // the activation arena (backend memory)
  uint64_t reload_floats = 0;   // offload: the reload buffers (backend memory)
  uint64_t store_floats = 0;    // offload: the host store of the offloaded layer inputs
};
Result<TrainingActivations> training_activations(const ModelConfig& cfg, const kernels::Backend& be, int tokens,
                                                 int max_seqlen);

// The activation arena of a KV-cache pass (DecodeSlots: prefill and decode) over `rows` rows whose
// longest prompt is `max_seqlen` long.
Result<uint64_t> inference_arena_floats(const ModelConfig& cfg, const kernels::Backend& be, int rows, int max_seqlen);

}  // namespace troupe::policy
