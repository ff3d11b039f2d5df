// Sizes of a model's arenas without allocating them: a Model::Impl is built (its tensor table only,
// no parameter memory) and asked for the layout Model::forward_train and DecodeSlots carve.
// Invariant: no buffer is allocated here; the sizes are Model::Impl's own, never re-derived.
#include "troupe/policy/memory_footprint.h"

#include <algorithm>
#include <memory>
#include <string>

#include "model_impl.h"
#include "troupe/policy/model.h"

namespace troupe::policy {
namespace {

// An Impl over cfg's tables (the offload copy thread is not started: only sizes are asked).
std::unique_ptr<Model::Impl> sizing_impl(const ModelConfig& cfg, const kernels::Backend& be) {
  ModelConfig c = cfg;
  c.offload_activations = false;
  auto impl = std::make_unique<Model::Impl>(c, be);
  impl->cfg.offload_activations = cfg.offload_activations;
  if (cfg.lora.enabled()) {
    impl->lora = true;
    impl->lora_r = cfg.lora.rank;
    impl->build_lora_table();
  }
  return impl;
}

Status check(const ModelConfig& cfg, int tokens, int max_seqlen) {
  // The shape alone: no device is started (sizes do not depend on it) and share_gpu is not set.
  ModelConfig shape = cfg;
  shape.device = kernels::DeviceKind::cpu;
  shape.share_gpu = false;
  shape.compute_dtype = kernels::ComputeDtype::fp32;
  TROUPE_TRY(validate_model_config(shape));
  if (cfg.lora.enabled()) TROUPE_TRY(validate_lora(cfg.lora, cfg));
  if (tokens < 1 || max_seqlen < 1 || max_seqlen > tokens)
    return invalid_input("memory footprint: need 1 <= max_seqlen (" + std::to_string(max_seqlen) + ") <= tokens (" +
                         std::to_string(tokens) + ")");
  return {};
}

}  // namespace

Result<ModelFootprint> model_footprint(const ModelConfig& cfg) {
  TROUPE_TRY(check(cfg, 1, 1));
  auto impl = sizing_impl(cfg, kernels::cpu_backend());
  ModelFootprint f;
  f.param_floats = impl->n_params;
  f.lora_floats = cfg.lora.enabled() ? impl->n_lora : 0;
  uint64_t in_layers = 0;
  for (int l = 0; l < impl->L; ++l) {
    uint64_t n = 0;
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    for (const auto& t : impl->table)
      if (t.name.starts_with(prefix)) n += t.numel();
    in_layers += n;
    f.largest_layer_floats = std::max(f.largest_layer_floats, n);
    if (cfg.lora.enabled() && impl->layers[l].moe) {
      const uint64_t E = impl->moe_cfg.E, H = impl->moe_cfg.H, HS = impl->moe_cfg.H_shared, C = impl->C;
      f.moe_sink_floats = std::max(f.moe_sink_floats, E * C + 3 * E * H * C + 3 * HS * C);
    }
  }
  f.outer_floats = f.param_floats - std::min<uint64_t>(f.param_floats, in_layers);
  f.kv_floats_per_token = 2ull * impl->L * impl->NKV * impl->HD;
  return f;
}

Result<TrainingActivations> training_activations(const ModelConfig& cfg, const kernels::Backend& be, int tokens,
                                                 int max_seqlen) {
  TROUPE_TRY(check(cfg, tokens, max_seqlen));
  auto impl = sizing_impl(cfg, be);
  const int L = impl->L;
  const bool ckpt = cfg.activation_checkpointing;
  const bool offload = ckpt && cfg.offload_activations;
  const int ring = offload ? std::min(L + 1, Model::Impl::kOffloadRing) : L + 1;
  TrainingActivations a;
  a.arena_floats = impl->arena_layout(tokens, max_seqlen, ring, ckpt ? 1 : L, true).floats;
  if (offload) {
    const uint64_t tc = static_cast<uint64_t>(tokens) * impl->C;
    a.reload_floats = (cfg.offload_double_buffer ? 2 : 1) * tc;
    a.store_floats = static_cast<uint64_t>(L) * tc;
  }
  return a;
}

Result<uint64_t> inference_arena_floats(const ModelConfig& cfg, const kernels::Backend& be, int rows, int max_seqlen) {
  TROUPE_TRY(check(cfg, std::max(rows, max_seqlen), max_seqlen));
  auto impl = sizing_impl(cfg, be);
  return impl->arena_layout(rows, max_seqlen, 2, 1, false).floats;
}

}  // namespace troupe::policy
