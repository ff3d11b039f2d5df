// The policy model: a Llama-style decoder (llama, qwen2, qwen3 dense; qwen2_moe, qwen3_moe, mixtral
// MoE) on the ops of a troupe::kernels::Backend (the one
// policy.device selects). Parameters and gradients are one flat arena each laid out from one tensor
// table (experts of a layer contiguous, so the MoE kernel sees (E, H, C) blocks); activations are a
// third arena carved per batch size; all three, and the KV cache, are backend Buffers. No tensor
// math happens here: every loop over a tensor is a backend op. Backward is the forward's call list
// reversed; every parameter gradient is accumulated (+=).
#include "troupe/policy/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "model_impl.h"
#include "troupe/kernels/backend.h"
#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/chunked_logprob.h"
#include "troupe/kernels/device.h"
#include "troupe/kernels/random.h"
#include "troupe/policy/expert_blocks.h"

namespace troupe::policy {

namespace k = troupe::kernels;

// ---- batch validation and packed metadata ---------------------------------------------------------

Status validate_packed_batch(const PackedBatch& b, int vocab_size, bool need_targets) {
  const size_t T = b.tokens.size();
  if (T == 0) return invalid_input("packed batch: no tokens");
  if (T > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 2))
    return invalid_input("packed batch: too many tokens (" + std::to_string(T) + ")");
  if (b.cu_seqlens.size() < 2) return invalid_input("packed batch: cu_seqlens needs at least 2 entries (got " +
                                                    std::to_string(b.cu_seqlens.size()) + ")");
  if (b.cu_seqlens.front() != 0)
    return invalid_input("packed batch: cu_seqlens[0] must be 0, got " + std::to_string(b.cu_seqlens.front()));
  for (size_t i = 1; i < b.cu_seqlens.size(); ++i)
    if (b.cu_seqlens[i] < b.cu_seqlens[i - 1])
      return invalid_input("packed batch: cu_seqlens decreases at index " + std::to_string(i) + " (" +
                           std::to_string(b.cu_seqlens[i - 1]) + " -> " + std::to_string(b.cu_seqlens[i]) + ")");
  if (static_cast<size_t>(b.cu_seqlens.back()) != T)
    return invalid_input("packed batch: cu_seqlens.back() = " + std::to_string(b.cu_seqlens.back()) +
                         " but there are " + std::to_string(T) + " tokens");
  for (size_t t = 0; t < T; ++t)
    if (b.tokens[t] < 0 || b.tokens[t] >= vocab_size)
      return invalid_input("packed batch: tokens[" + std::to_string(t) + "] = " + std::to_string(b.tokens[t]) +
                           " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  if (b.targets.empty() && !need_targets) return {};
  if (b.targets.size() != T)
    return invalid_input("packed batch: " + std::to_string(b.targets.size()) + " targets for " + std::to_string(T) +
                         " tokens");
  for (size_t t = 0; t < T; ++t)
    if (b.targets[t] < -1 || b.targets[t] >= vocab_size)
      return invalid_input("packed batch: targets[" + std::to_string(t) + "] = " + std::to_string(b.targets[t]) +
                           " is outside [-1, " + std::to_string(vocab_size) + ")");
  return {};
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  if (c.rope_type == RopeType::unscaled) return {};
  const int HD = c.head_dim, half = HD / 2;
  std::vector<float> inv(half);
  // fp32 like transformers' _compute_*_parameters (modeling_rope_utils.py).
  for (int i = 0; i < half; ++i)
    inv[i] = 1.0f / std::pow(c.rope_theta, static_cast<float>(2 * i) / static_cast<float>(HD));
  const float factor = c.rope_factor;
  if (c.rope_type == RopeType::linear) {
    for (auto& f : inv) f /= factor;
    return inv;
  }
  // llama3: wavelengths above original/low_freq_factor are divided by factor, below
  // original/high_freq_factor kept, and the band between interpolated smoothly.
  const float old_ctx = static_cast<float>(c.rope_original_max_position_embeddings);
  const float lff = c.rope_low_freq_factor, hff = c.rope_high_freq_factor;
  const float low_wavelen = old_ctx / lff, high_wavelen = old_ctx / hff;
  constexpr float kTwoPi = 6.283185307179586f;
  for (auto& f : inv) {
    const float wavelen = kTwoPi / f;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    if (medium) {
      const float smooth = (old_ctx / wavelen - lff) / (hff - lff);
      f = (1.0f - smooth) * scaled / factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
  return inv;
}

namespace {

// meta->dev laid out for T tokens and S sequences: cu_seqlens (S+1) and positions (T) as int32,
// then the RoPE tables (T, head_dim/2) each, 16-byte aligned.
Status carve_meta_dev(PackedMeta* m, int T, int S, int head_dim, const kernels::Backend& be) {
  const size_t ints = (static_cast<size_t>(S + 1) + T + 3) / 4 * 4;
  const size_t half = static_cast<size_t>(T) * head_dim / 2;
  TROUPE_TRY(be.grow(m->dev, sizeof(int32_t) * ints + sizeof(float) * 2 * half));
  auto* base = static_cast<int32_t*>(m->dev.data());
  m->d_cu_seqlens = base;
  m->d_positions = base + S + 1;
  m->rope_cos = reinterpret_cast<float*>(base + ints);
  m->rope_sin = m->rope_cos + half;
  return {};
}

void rope_tables(const PackedMeta& m, int N, int head_dim, float rope_theta, const float* inv_freq,
                 const kernels::Backend& be) {
  if (!inv_freq)
    be.rope_cos_sin(m.rope_cos, m.rope_sin, m.d_positions, N, head_dim, rope_theta);
  else
    be.rope_cos_sin_inv_freq(m.rope_cos, m.rope_sin, m.d_positions, inv_freq, N, head_dim);
}

}  // namespace

Status build_packed_meta(PackedMeta* m, const PackedBatch& b, int head_dim, float rope_theta, const float* inv_freq,
                         const kernels::Backend& be) {
  const int T = static_cast<int>(b.tokens.size());
  m->T = T;
  m->S = static_cast<int>(b.cu_seqlens.size()) - 1;
  m->cu_seqlens.assign(b.cu_seqlens.begin(), b.cu_seqlens.end());
  m->positions.resize(T);
  m->seq_ids.resize(T);
  m->seq_start.resize(T);
  m->seq_end.resize(T);
  m->max_seqlen = be.packed_seq_layout(m->positions.data(), m->seq_ids.data(), m->seq_start.data(),
                                       m->seq_end.data(), m->cu_seqlens.data(), m->S);
  TROUPE_TRY(carve_meta_dev(m, T, m->S, head_dim, be));
  be.copy_host_to_device(m->d_cu_seqlens, m->cu_seqlens.data(), sizeof(int32_t) * (m->S + 1));
  be.copy_host_to_device(m->d_positions, m->positions.data(), sizeof(int32_t) * T);
  rope_tables(*m, T, head_dim, rope_theta, inv_freq, be);
  return {};
}

Status build_decode_meta(PackedMeta* m, const int32_t* pos, int B, int head_dim, float rope_theta,
                         const float* inv_freq, const kernels::Backend& be) {
  m->T = B;
  m->S = 0;
  m->max_seqlen = 1;
  TROUPE_TRY(carve_meta_dev(m, B, 0, head_dim, be));
  be.copy_host_to_device(m->d_positions, pos, sizeof(int32_t) * B);
  rope_tables(*m, B, head_dim, rope_theta, inv_freq, be);
  return {};
}

Status validate_model_config(const ModelConfig& c) {
  auto bad = [](const std::string& field, const std::string& why) {
    return invalid_input("model config: " + field + ": " + why);
  };
  using F = ModelFamily;
  if (!is_moe_family(c.family) && c.num_experts != 0)
    return bad("num_experts", enum_string(c.family) + " is a dense family (num_experts must be 0, got " +
                                  std::to_string(c.num_experts) + ")");
  if (c.family == F::qwen2 && !c.qkv_bias) return bad("qkv_bias", "qwen2 has q/k/v biases (must be true)");
  if (c.family == F::mixtral && c.qkv_bias) return bad("qkv_bias", "mixtral has no attention biases");
  if ((c.family == F::mixtral || c.family == F::qwen2 || c.family == F::qwen2_moe) && c.o_proj_bias)
    return bad("o_proj_bias", enum_string(c.family) + " has no o_proj bias");
  if (c.vocab_size <= 0) return bad("vocab_size", "must be > 0");
  if (c.hidden_size <= 0) return bad("hidden_size", "must be > 0");
  if (c.num_hidden_layers <= 0) return bad("num_hidden_layers", "must be > 0");
  if (c.num_attention_heads <= 0 || c.num_key_value_heads <= 0)
    return bad("num_attention_heads/num_key_value_heads", "must be > 0");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return bad("num_key_value_heads", std::to_string(c.num_key_value_heads) + " does not divide num_attention_heads " +
                                          std::to_string(c.num_attention_heads));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) return bad("head_dim", "must be even and > 0 (RoPE rotates halves)");
  bool any_dense = false, any_moe = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) (c.is_moe_layer(l) ? any_moe : any_dense) = true;
  for (int d : c.mlp_only_layers)
    if (d < 0 || d >= c.num_hidden_layers)
      return bad("mlp_only_layers", "layer " + std::to_string(d) + " does not exist (num_hidden_layers " +
                                        std::to_string(c.num_hidden_layers) + ")");
  if (any_dense && c.intermediate_size <= 0) return bad("intermediate_size", "must be > 0 for dense layers");
  if (any_moe) {
    if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
      return bad("num_experts_per_tok", std::to_string(c.num_experts_per_tok) + " must be in [1, num_experts=" +
                                            std::to_string(c.num_experts) + "]");
    if (c.moe_intermediate_size <= 0) return bad("moe_intermediate_size", "must be > 0");
    if (c.shared_expert_intermediate_size < 0) return bad("shared_expert_intermediate_size", "must be >= 0");
  }
  if (!(c.rope_theta > 0)) return bad("rope_theta", "must be > 0");
  if (c.rope_type != RopeType::unscaled && !(c.rope_factor > 0)) return bad("rope_factor", "must be > 0");
  if (c.rope_type == RopeType::llama3 &&
      (!(c.rope_low_freq_factor > 0) || !(c.rope_high_freq_factor > c.rope_low_freq_factor) ||
       c.rope_original_max_position_embeddings <= 0))
    return bad(
        "rope_low_freq_factor/rope_high_freq_factor/rope_original_max_position_embeddings",
        "llama3 RoPE needs 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0");
  if (!(c.rms_norm_eps > 0)) return bad("rms_norm_eps", "must be > 0");
  if (!(c.router_aux_loss_coef >= 0)) return bad("router_aux_loss_coef", "must be >= 0");
  if (c.routing_replay == RoutingReplay::rollout && !any_moe)
    return bad("routing_replay", "rollout replays MoE routing, but this model is dense (no MoE layer)");
  if (c.offload_activations && !c.activation_checkpointing)
    return bad("offload_activations", "needs activation_checkpointing: true (only checkpointed layer inputs are offloaded)");
  if (c.share_gpu) kernels::set_cuda_share_gpu(true);  // before the CUDA backend first starts
  auto be = kernels::backend_for(c.device);
  if (!be.ok()) return bad("device", "'" + enum_string(c.device) + "': " + be.error().message);
  if (c.compute_dtype == kernels::ComputeDtype::bf16 && !(*be)->supports_bf16_compute())
    return bad("compute_dtype", "bf16 GEMMs are not implemented on device '" + enum_string(c.device) + "' (cuda only)");
  if (c.compute_dtype == kernels::ComputeDtype::bf16 && c.batch_invariant)
    return bad("compute_dtype", "bf16 with batch_invariant: exact on-policy sampling runs fp32 GEMMs");
  return validate_lora(c.lora, c);
}

// ---- construction ---------------------------------------------------------------------------------

Model::Impl::Impl(const ModelConfig& c, const kernels::Backend& backend, int shard, int shards)
    : cfg(c), be(&backend) {
  eshard.shard = shard;
  eshard.shards = shards;
  // policy.compute_dtype auto: bf16 GEMMs where the backend has them (cuda), fp32 elsewhere
  cfg.compute_dtype = kernels::resolve_compute_dtype(c.compute_dtype, backend.supports_bf16_compute(), c.batch_invariant);
  C = c.hidden_size;
  NH = c.num_attention_heads;
  NKV = c.num_key_value_heads;
  HD = c.head_dim;
  V = c.vocab_size;
  L = c.num_hidden_layers;
  I = c.intermediate_size;
  qk = c.qk_norm();
  moe_cfg.C = C;
  moe_cfg.H = c.moe_intermediate_size;
  moe_cfg.E = c.num_experts;
  moe_cfg.K = c.num_experts_per_tok;
  moe_cfg.renormalize = c.family == ModelFamily::mixtral ? true : c.norm_topk_prob;
  // qwen2_moe's gated shared expert runs beside the MoE kernel (whose shared expert is unweighted).
  moe_cfg.H_shared = c.shared_expert_gated() ? 0 : c.shared_expert_intermediate_size;
  HS_gated = c.shared_expert_gated() ? c.shared_expert_intermediate_size : 0;
  inv_freq = rope_inv_freq(c);
  moe_cfg.grouped = c.moe_grouped;
  for (int l = 0; l < L; ++l) (c.is_moe_layer(l) ? any_moe : any_dense) = true;
  build_table();
  moe_stats.assign(L, {});
  moe_ordinal.assign(L, -1);
  for (int l = 0, n = 0; l < L; ++l)
    if (c.is_moe_layer(l)) moe_ordinal[l] = n++;
  if (any_moe) routing_width = static_cast<int>(std::count_if(moe_ordinal.begin(), moe_ordinal.end(),
                                                              [](int o) { return o >= 0; })) * moe_cfg.K;
  // The CPU copy engine serves the cpu backend; a device backend brings its own (make_layer_offload).
  if (cfg.offload_activations && backend.host_visible()) engine = std::make_unique<k::CopyEngine>();
}

void Model::Impl::build_table() {
  size_t off = 0;
  // A sliced model (slice_experts) also records the whole model's table and where its pieces lie.
  size_t& whole = eshard.whole_size;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorSpec t{name, std::move(shape), off};
    off += t.numel();
    const size_t at = t.offset;
    if (sliced()) {
      eshard.whole_table.push_back({t.name, t.shape, whole});
      whole += t.numel();
    }
    table.push_back(std::move(t));
    return at;
  };
  auto add_at = [&](const std::string& name, std::vector<int64_t> shape, size_t at) {
    table.push_back(TensorSpec{name, std::move(shape), at});
  };
  // A linear weight the quantized base holds in blocks (QLoRA), else an arena tensor.
  auto addw = [&](const std::string& name, int rows, int cols) {
    if (!quant_base()) return add(name, {rows, cols});
    return add_quant_slot(name, rows, cols);
  };
  const bool mix = cfg.family == ModelFamily::mixtral;
  wte = add("model.embed_tokens.weight", {V, C});
  layers.resize(L);
  for (int l = 0; l < L; ++l) {
    LayerW& w = layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.ln1 = add(p + "input_layernorm.weight", {C});
    w.wq = addw(p + "self_attn.q_proj.weight", NH * HD, C);
    if (cfg.qkv_bias) w.bq = add(p + "self_attn.q_proj.bias", {NH * HD});
    w.wk = addw(p + "self_attn.k_proj.weight", NKV * HD, C);
    if (cfg.qkv_bias) w.bk = add(p + "self_attn.k_proj.bias", {NKV * HD});
    w.wv = addw(p + "self_attn.v_proj.weight", NKV * HD, C);
    if (cfg.qkv_bias) w.bv = add(p + "self_attn.v_proj.bias", {NKV * HD});
    w.wo = addw(p + "self_attn.o_proj.weight", C, NH * HD);
    if (cfg.o_proj_bias) w.bo = add(p + "self_attn.o_proj.bias", {C});
    if (qk) {
      w.qn = add(p + "self_attn.q_norm.weight", {HD});
      w.kn = add(p + "self_attn.k_norm.weight", {HD});
    }
    w.ln2 = add(p + "post_attention_layernorm.weight", {C});
    w.moe = cfg.is_moe_layer(l);
    if (!w.moe) {
      w.wg = addw(p + "mlp.gate_proj.weight", I, C);
      w.wu = addw(p + "mlp.up_proj.weight", I, C);
      w.wd = addw(p + "mlp.down_proj.weight", C, I);
      continue;
    }
    const int E = moe_cfg.E, H = moe_cfg.H;
    const std::string m = p + (mix ? "block_sparse_moe." : "mlp.");
    w.router = add(m + "gate.weight", {E, C});
    // Expert blocks (El, H, C), (El, H, C), (El, C, H): one table entry per expert, HF names. El = E
    // but in a sliced model, which holds experts [first, first + El) only.
    const int El = E / eshard.shards, first = eshard.shard * El;
    const size_t block = static_cast<size_t>(El) * H * C;
    w.eg = off;
    w.eu = w.eg + block;
    w.ed = w.eu + block;
    off = w.ed + block;
    const char* kind[3] = {mix ? "w1.weight" : "gate_proj.weight", mix ? "w3.weight" : "up_proj.weight",
                           mix ? "w2.weight" : "down_proj.weight"};
    for (int e = first; e < first + El; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      const size_t eo = static_cast<size_t>(e - first) * H * C;
      add_at(x + kind[0], {H, C}, w.eg + eo);
      add_at(x + kind[1], {H, C}, w.eu + eo);
      add_at(x + kind[2], {C, H}, w.ed + eo);
    }
    if (sliced()) {
      const size_t all = static_cast<size_t>(E) * H * C;
      for (int e = 0; e < E; ++e)
        for (int k = 0; k < 3; ++k)
          eshard.whole_table.push_back({m + "experts." + std::to_string(e) + "." + kind[k],
                                        k < 2 ? std::vector<int64_t>{H, C} : std::vector<int64_t>{C, H},
                                        whole + k * all + static_cast<size_t>(e) * H * C});
      whole += 3 * all;
    }
    if (cfg.shared_expert_intermediate_size > 0) {
      const int HS = cfg.shared_expert_intermediate_size;
      // The gated shared expert runs through linear_forward (quantizable); the MoE kernel's
      // ungated one reads fp32 weights.
      const bool lin = HS_gated > 0;
      w.sg = lin ? addw(m + "shared_expert.gate_proj.weight", HS, C) : add(m + "shared_expert.gate_proj.weight", {HS, C});
      w.su = lin ? addw(m + "shared_expert.up_proj.weight", HS, C) : add(m + "shared_expert.up_proj.weight", {HS, C});
      w.sd = lin ? addw(m + "shared_expert.down_proj.weight", C, HS) : add(m + "shared_expert.down_proj.weight", {C, HS});
      if (HS_gated > 0) w.sgate = add(m + "shared_expert_gate.weight", {1, C});
    }
  }
  wnorm = add("model.norm.weight", {C});
  wlm = cfg.tie_word_embeddings ? wte : add("lm_head.weight", {V, C});
  n_params = off;
  // (the whole arena's stretches by block, the one source of the expert ranges: expert_blocks.h)
  if (sliced()) eshard.pieces = expert_block_pieces(eshard.whole_table, table, eshard.shard, eshard.shards);
}

Status Model::Impl::alloc_params() {
  TROUPE_ASSIGN_OR_RETURN(params, be->alloc(n_params * sizeof(float), "the weights (" + std::to_string(n_params) + " floats)"));
  TROUPE_ASSIGN_OR_RETURN(grads, be->alloc(n_params * sizeof(float), "the gradients (" + std::to_string(n_params) + " floats)"));
  mirrored = !be->host_visible();
  if (mirrored) {
    TROUPE_TRY(host_params.allocate(*be, n_params, "the host mirror of the weights (" + std::to_string(n_params) + " floats)"));
    host_grads.assign(n_params, 0.0f);
  }
  if (!inv_freq.empty()) {
    TROUPE_ASSIGN_OR_RETURN(inv_freq_dev, be->alloc(inv_freq.size() * sizeof(float)));
    be->copy_host_to_device(inv_freq_dev.data(), inv_freq.data(), inv_freq.size() * sizeof(float));
  }
  return {};
}

Result<int32_t*> Model::Impl::stage_ints(k::Buffer& buf, const int32_t* host, size_t n, size_t at) const {
  TROUPE_TRY(be->grow(buf, sizeof(int32_t) * (at + n)));
  int32_t* d = static_cast<int32_t*>(buf.data()) + at;
  be->copy_host_to_device(d, host, sizeof(int32_t) * n);
  return d;
}

void Model::Impl::record_routing(int l, const LayerActs& a, int T) {
  if (!routing_out) return;
  const int K = moe_cfg.K;
  routing_tmp.resize(static_cast<size_t>(T) * K);
  be->moe_experts_to_host(routing_tmp.data(), a.moe_saved, moe_cfg, T);
  for (int t = 0; t < T; ++t)
    std::copy(routing_tmp.begin() + static_cast<std::ptrdiff_t>(t) * K,
              routing_tmp.begin() + static_cast<std::ptrdiff_t>(t + 1) * K,
              routing_out + static_cast<size_t>(t) * routing_width + static_cast<size_t>(moe_ordinal[l]) * K);
}

namespace {
// Advances *rng past what fill_normal of n values draws: two splitmix64 draws per pair of values
// (kernels/cpu/random.cpp), each adding the same constant to the state.
void skip_normal(size_t n, uint64_t* rng) { *rng += static_cast<uint64_t>((n + 1) / 2 * 2) * 0x9E3779B97F4A7C15ull; }
}  // namespace

Status Model::Impl::init_params(uint64_t seed) {
  uint64_t s = seed;
  size_t quant_index = 0;
  // A block of the experts (create_expert_block) draws the whole model's stream in the whole table's
  // order, skipping the other blocks' experts (its own table is that order without them).
  size_t held = 0;
  for (const auto& w : sliced() ? eshard.whole_table : table) {
    if (sliced() && (held == table.size() || table[held].name != w.name)) {
      skip_normal(w.numel(), &s);  // (another block's routed expert: N(0, 0.02) in the whole model)
      continue;
    }
    const TensorSpec& t = sliced() ? table[held++] : w;
    if (t.quantized)  // drawn as an arena tensor would be, then quantized (gguf: left for the loader)
      TROUPE_TRY(init_quant(quant_index++, &s));
    else if (t.name.find("norm.weight") != std::string::npos)
      be->fill(P() + t.offset, t.numel(), 1.0f);
    else if (t.name.ends_with(".bias"))
      be->fill(P() + t.offset, t.numel(), 0.0f);
    else
      be->fill_normal(P() + t.offset, t.numel(), 0.02, &s);
  }
  weights_written(params);
  if (mirrored) be->copy_device_to_host(host_params.data(), P(), sizeof(float) * n_params);
  return {};
}

template <class Tensors>
Tensors Model::Impl::moe_tensors(int l, float* base) const {
  const LayerW& w = layers[l];
  Tensors t;
  t.w_router = base + w.router;
  t.w_gate = base + w.eg;
  t.w_up = base + w.eu;
  t.w_down = base + w.ed;
  if (moe_cfg.H_shared > 0) {
    t.ws_gate = base + w.sg;
    t.ws_up = base + w.su;
    t.ws_down = base + w.sd;
  }
  return t;
}

k::MoeWeights Model::Impl::moe_call_weights(int l) {
  k::MoeWeights mw = moe_tensors<k::MoeWeights>(l, P());
  if (layers[l].lx.on) mw.lora = moe_lora(l, LP());
  return mw;
}
// A frozen base (LoRA) still runs the kernel's backward for d h2; its weight gradients go to the sink.
k::MoeGrads Model::Impl::moe_call_grads(int l) {
  k::MoeGrads mg = lora ? moe_sink_grads(l) : moe_tensors<k::MoeGrads>(l, G());
  if (layers[l].lx.on) mg.lora = moe_lora_grads(l, LG());
  return mg;
}

// ---- activation arena -----------------------------------------------------------------------------

size_t Model::Impl::layer_ws_floats(int T) const {
  const size_t t = static_cast<size_t>(T);
  size_t n = t * C * 3 + t * 2                                       // h1, x2, h2, rstd1, rstd2
             + t * NH * HD * 3 + t * NKV * HD * 3 + t * NH          // q, qr, att, k, kr, v, lse
             + t * NH + t * NKV;                                     // rstd_q, rstd_k
  size_t ffn = 0;
  if (any_dense) ffn = std::max(ffn, t * I * 3);
  if (any_moe) ffn = std::max(ffn, be->moe_saved_floats(moe_cfg, T) + shared_saved_floats(T));
  return n + ffn;
}

ArenaLayout Model::Impl::arena_layout(int T, int max_seqlen, int n_resid, int n_ws, bool with_grads) const {
  const size_t t = static_cast<size_t>(T);
  ArenaLayout g;
  size_t& off = g.floats;
  g.resid.resize(n_resid);
  g.ws.resize(n_ws);
  for (auto& r : g.resid) r = off, off += t * C;
  const size_t wsn = layer_ws_floats(T);
  for (auto& w : g.ws) w = off, off += wsn;
  auto take = [&](size_t n) {
    const size_t at = off;
    off += n;
    return at;
  };
  // Buffers whose lifetimes do not overlap share one region U (this is most of what stays in the
  // arena under offload): the final norm output and logits (end of forward -> start of backward;
  // dlogits overwrites logits in place), the MoE kernel's scratch (inside one MoE call), and the
  // per-layer backward temporaries (inside one layer's backward, after the MoE call).
  const size_t QD = static_cast<size_t>(NH) * HD, KD = static_cast<size_t>(NKV) * HD;
  const size_t moe_scr = any_moe ? be->moe_scratch_floats(moe_cfg, T) : 0;
  const size_t head_n = t * C + (chunked_head() ? k::chunked_logprob_fused_scratch_floats(T, V, cfg.logprob_chunk)
                                                : t * static_cast<size_t>(V));
  const size_t layer_n = with_grads ? t * (QD * 3 + KD * 3) + (any_dense ? 3 * t * I : 0) : 0;
  // The gated shared expert's output (forward) and backward temporaries also live in U.
  const size_t shared_n = HS_gated > 0 ? t * C + t + 3 * t * HS_gated : 0;
  g.u = take(std::max({moe_scr, head_n, layer_n, shared_n}));
  g.rstdf = take(t), g.lse = take(t), g.ent = take(t), g.logp = take(t), g.y = take(t * C);
  g.attn_scratch_floats = be->attention_scratch_floats(max_seqlen);
  g.attn_scratch = take(g.attn_scratch_floats);
  g.lora = take(scratch_rank() > 0 ? k::lora_scratch_floats(T, scratch_rank()) : 0);
  const bool drop = lora && cfg.lora.dropout > 0;
  const size_t widest_in = static_cast<size_t>(std::max({C, NH * HD, I, HS_gated}));
  g.lora_x = take(drop ? t * widest_in : 0);
  g.lora_dx = take(drop && with_grads ? t * widest_in : 0);
  if (with_grads) {
    g.dresid = take(t * C);
    g.dh = take(t * C);
    g.dlogp = take(t);
    g.dent = take(t);
  }
  return g;
}

Result<Acts> Model::Impl::carve(k::Buffer& arena, int T, int max_seqlen, int n_resid, int n_ws,
                        bool with_grads) const {
  const size_t t = static_cast<size_t>(T);
  const size_t QD = static_cast<size_t>(NH) * HD, KD = static_cast<size_t>(NKV) * HD;
  Acts a;
  a.T = T;
  const ArenaLayout g = arena_layout(T, max_seqlen, n_resid, n_ws, with_grads);
  const size_t off = g.floats;
  const auto& resid_off = g.resid;
  const auto& ws_off = g.ws;
  const size_t o_u = g.u, o_rstdf = g.rstdf, o_lse = g.lse, o_ent = g.ent, o_logp = g.logp, o_y = g.y;
  a.attn_scratch_floats = g.attn_scratch_floats;
  const size_t o_ascr = g.attn_scratch, o_lora = g.lora;
  const size_t o_dres = g.dresid, o_dh = g.dh, o_dlp = g.dlogp, o_dent = g.dent;
  const bool drop = lora && cfg.lora.dropout > 0;
  const size_t o_lx = g.lora_x, o_ldx = g.lora_dx;
  TROUPE_TRY(be->grow(arena, off * sizeof(float), "the activation arena (" + std::to_string(T) + " tokens)"));
  float* B = arena.floats();
  for (auto r : resid_off) a.resid.push_back(B + r);
  for (auto w : ws_off) {
    LayerActs la;
    float* p = B + w;
    auto next = [&](size_t n) {
      float* q = p;
      p += n;
      return q;
    };
    la.h1 = next(t * C);
    la.x2 = next(t * C);
    la.h2 = next(t * C);
    la.rstd1 = next(t);
    la.rstd2 = next(t);
    la.q = next(t * NH * HD);
    la.qr = next(t * NH * HD);
    la.att = next(t * NH * HD);
    la.k = next(t * NKV * HD);
    la.kr = next(t * NKV * HD);
    la.v = next(t * NKV * HD);
    la.lse = next(t * NH);
    la.rstdq = next(t * NH);
    la.rstdk = next(t * NKV);
    la.g = p;  // dense: g, u, a (T, I) each; MoE: the kernel's saved buffer (same region)
    la.u = p + t * I;
    la.a = p + 2 * t * I;
    la.moe_saved = p;
    if (HS_gated > 0) {
      const size_t th = t * HS_gated;
      la.sg = p + be->moe_saved_floats(moe_cfg, T);
      la.su = la.sg + th;
      la.sa = la.su + th;
      la.so = la.sa + th;
      la.sgl = la.so + t * C;
    }
    a.ws.push_back(la);
  }
  float* U = B + o_u;
  a.final_norm_out = U;
  a.logits = U + t * C;
  a.moe_scratch = U;
  a.rstdf = B + o_rstdf;
  a.lse_out = B + o_lse;
  a.ent_saved = B + o_ent;
  a.logp_out = B + o_logp;
  a.y = B + o_y;
  a.attn_scratch = B + o_ascr;
  if (scratch_rank() > 0) a.lora_scratch = B + o_lora;
  if (drop) a.lora_x = B + o_lx;
  if (drop && with_grads) a.lora_dx = B + o_ldx;
  if (with_grads) {
    a.dresid = B + o_dres;
    a.dh = B + o_dh;
    a.dlogp_in = B + o_dlp;
    a.dent_in = B + o_dent;
    a.dlogits = a.logits;  // in place
    a.datt = U;
    a.dq = a.datt + t * QD;
    a.dqr = a.dq + t * QD;
    a.dk = a.dqr + t * QD;
    a.dv = a.dk + t * KD;
    a.dkr = a.dv + t * KD;
    a.dg = a.dkr + t * KD;
    a.du = a.dg + t * I;
    a.da = a.du + t * I;
    a.x_recompute = a.y;  // the recomputed layer output is thrown away; x_out = x2 + y works in place
  }
  a.floats = off;
  return a;
}

// ---- one decoder layer ----------------------------------------------------------------------------

void Model::Impl::layer_forward(int l, const float* x, float* x_out, const LayerActs& a, const Acts& acts,
                                const PackedMeta& m, int T, const KvCtx* kv) {
  const LayerW& w = layers[l];
  const float* P = this->P();
  const float eps = cfg.rms_norm_eps;
  const int QD = NH * HD, KD = NKV * HD;
  be->rmsnorm_forward(a.h1, a.rstd1, x, P + w.ln1, T, C, eps);
  linear_forward_group({{a.q, w.wq, &w.lq, QD}, {a.k, w.wk, &w.lk, KD}, {a.v, w.wv, &w.lv, KD}}, a.h1, acts, T, C);
  if (cfg.qkv_bias) {
    be->bias_forward(a.q, P + w.bq, T, QD);
    be->bias_forward(a.k, P + w.bk, T, KD);
    be->bias_forward(a.v, P + w.bv, T, KD);
  }
  const float* qsrc = a.q;
  const float* ksrc = a.k;
  if (qk) {
    be->rmsnorm_forward(a.qr, a.rstdq, a.q, P + w.qn, T * NH, HD, eps);
    be->rmsnorm_forward(a.kr, a.rstdk, a.k, P + w.kn, T * NKV, HD, eps);
    qsrc = a.qr;
    ksrc = a.kr;
  }
  be->rope_forward(a.qr, qsrc, m.rope_cos, m.rope_sin, T, NH, HD);
  be->rope_forward(a.kr, ksrc, m.rope_cos, m.rope_sin, T, NKV, HD);
  if (kv) {
    // Write this step's keys/values at (slot, position) of layer l's cache.
    be->kv_cache_write(kv->k_cache + static_cast<size_t>(l) * kv->layer_stride,
                       kv->v_cache + static_cast<size_t>(l) * kv->layer_stride, a.kr, a.v, kv->slot, kv->pos, T,
                       kv->cache_len, KD);
  }
  if (kv && kv->decode) {
    const float* kc = kv->k_cache + static_cast<size_t>(l) * kv->layer_stride;
    const float* vc = kv->v_cache + static_cast<size_t>(l) * kv->layer_stride;
    be->attention_decode_forward(a.att, a.qr, kc, vc, kv->kv_len, kv->slot, T, kv->cache_len, NH, NKV, HD);
  } else {
    be->attention_forward(a.att, a.lse, acts.attn_scratch, acts.attn_scratch_floats, a.qr, a.kr, a.v,
                         m.d_cu_seqlens, m.S, m.max_seqlen, T, NH, NKV, HD);
  }
  linear_forward(a.x2, a.att, w.wo, w.lo, acts, T, QD, C);
  if (cfg.o_proj_bias) be->bias_forward(a.x2, P + w.bo, T, C);
  const size_t TC = static_cast<size_t>(T) * C;
  be->add(a.x2, a.x2, x, TC);  // residual: x2 = x + attention
  be->rmsnorm_forward(a.h2, a.rstd2, a.x2, P + w.ln2, T, C, eps);
  float* y = acts.y;
  if (!w.moe) {
    linear_forward_group({{a.g, w.wg, &w.lg, I}, {a.u, w.wu, &w.lu, I}}, a.h2, acts, T, C);
    be->swiglu_forward(a.a, a.g, a.u, T * I);
    linear_forward(y, a.a, w.wd, w.ld, acts, T, I, C);
  } else {
    const int32_t* route = replaying && !kv ? replay.data() + static_cast<size_t>(moe_ordinal[l]) * T * moe_cfg.K
                                            : nullptr;
    const k::MoeWeights mw = moe_call_weights(l);
    if (ep_exchange && !kv)
      ep_note(be->moe_ep_forward(y, a.moe_saved, &moe_stats[l], a.h2, mw, moe_cfg, T, acts.moe_scratch, route,
                                ep_group(l)));
    else
      be->moe_forward(y, a.moe_saved, &moe_stats[l], a.h2, mw, moe_cfg, T, acts.moe_scratch, route);
    record_routing(l, a, T);
    if (HS_gated > 0) {  // y += sigmoid(h2 . w_gate) * SwiGLU_shared(h2)
      const int HS = HS_gated;
      float* gated = acts.moe_scratch;  // (T, C); the MoE kernel's scratch is free again
      linear_forward(a.sg, a.h2, w.sg, w.lg, acts, T, C, HS);
      linear_forward(a.su, a.h2, w.su, w.lu, acts, T, C, HS);
      be->swiglu_forward(a.sa, a.sg, a.su, T * HS);
      linear_forward(a.so, a.sa, w.sd, w.ld, acts, T, HS, C);
      be->matmul_forward(a.sgl, a.h2, P + w.sgate, T, C, 1);
      be->sigmoid_gate_forward(gated, a.sgl, a.so, T, C);
      be->add(y, y, gated, TC);
    }
  }
  be->add(x_out, a.x2, y, TC);  // residual: x_out = x2 + FFN
}

// The FFN of layer l, reversed: dresid holds d x_out = d y; leaves d h2 in acts.dh.
void Model::Impl::ffn_backward(int l, const LayerActs& a, const Acts& acts, int T, float* dresid, float daux) {
  const LayerW& w = layers[l];
  const size_t TC = static_cast<size_t>(T) * C;
  if (!w.moe) {
    const size_t TI = static_cast<size_t>(T) * I;
    be->zero(acts.da, TI);
    linear_backward(acts.da, w.wd, w.ld, dresid, a.a, acts, T, I, C);
    be->swiglu_backward(acts.dg, acts.du, acts.da, a.g, a.u, T * I);
    be->zero(acts.dh, TC);
    linear_backward(acts.dh, w.wg, w.lg, acts.dg, a.h2, acts, T, C, I);
    linear_backward(acts.dh, w.wu, w.lu, acts.du, a.h2, acts, T, C, I);
    return;
  }
  const k::MoeGrads mg = moe_call_grads(l);
  const k::MoeWeights mw = moe_call_weights(l);
  if (ep_exchange)
    ep_note(be->moe_ep_backward(acts.dh, mg, dresid, daux, a.h2, a.moe_saved, mw, moe_cfg, T, acts.moe_scratch,
                               ep_group(l)));
  else
    be->moe_backward(acts.dh, mg, dresid, daux, a.h2, a.moe_saved, mw, moe_cfg, T, acts.moe_scratch);
  if (HS_gated > 0) {  // the gated shared expert, reversed; its temporaries in U after the MoE call
    const int HS = HS_gated;
    const size_t TH = static_cast<size_t>(T) * HS;
    float* dso = acts.moe_scratch;
    float* dsgl = dso + TC;
    float* dsa = dsgl + T;
    float* dsg = dsa + TH;
    float* dsu = dsg + TH;
    be->sigmoid_gate_backward(dsgl, dso, dresid, a.sgl, a.so, T, C);
    be->matmul_backward(acts.dh, gw(w.sgate), dsgl, a.h2, P() + w.sgate, T, C, 1);
    be->zero(dsa, TH);
    linear_backward(dsa, w.sd, w.ld, dso, a.sa, acts, T, HS, C);
    be->swiglu_backward(dsg, dsu, dsa, a.sg, a.su, T * HS);
    linear_backward(acts.dh, w.sg, w.lg, dsg, a.h2, acts, T, C, HS);
    linear_backward(acts.dh, w.su, w.lu, dsu, a.h2, acts, T, C, HS);
  }
}

void Model::Impl::layer_backward(int l, const float* x, const LayerActs& a, const Acts& acts, const PackedMeta& m,
                                 int T, float* dresid, float daux) {
  const LayerW& w = layers[l];
  const float* P = this->P();
  const int QD = NH * HD, KD = NKV * HD;
  const size_t TC = static_cast<size_t>(T) * C;
  ffn_backward(l, a, acts, T, dresid, daux);
  be->rmsnorm_backward(dresid, gw(w.ln2), acts.dh, a.x2, P + w.ln2, a.rstd2, T, C);  // dresid = d x2
  // Attention.
  if (cfg.o_proj_bias && !lora) be->bias_backward(G() + w.bo, dresid, T, C);
  be->zero(acts.datt, static_cast<size_t>(T) * QD);
  linear_backward(acts.datt, w.wo, w.lo, dresid, a.att, acts, T, QD, C);
  be->attention_backward(acts.dqr, acts.dkr, acts.dv, acts.attn_scratch, acts.attn_scratch_floats, acts.datt, a.qr,
                        a.kr, a.v, a.att, a.lse, m.d_cu_seqlens, m.S, m.max_seqlen, T, NH, NKV, HD);
  be->rope_backward(acts.dqr, acts.dqr, m.rope_cos, m.rope_sin, T, NH, HD);
  be->rope_backward(acts.dkr, acts.dkr, m.rope_cos, m.rope_sin, T, NKV, HD);
  const float* dq = acts.dqr;
  const float* dk = acts.dkr;
  if (qk) {
    be->zero(acts.dq, static_cast<size_t>(T) * QD);
    be->zero(acts.dk, static_cast<size_t>(T) * KD);
    be->rmsnorm_backward(acts.dq, gw(w.qn), acts.dqr, a.q, P + w.qn, a.rstdq, T * NH, HD);
    be->rmsnorm_backward(acts.dk, gw(w.kn), acts.dkr, a.k, P + w.kn, a.rstdk, T * NKV, HD);
    dq = acts.dq;
    dk = acts.dk;
  }
  if (cfg.qkv_bias && !lora) {
    be->bias_backward(G() + w.bq, dq, T, QD);
    be->bias_backward(G() + w.bk, dk, T, KD);
    be->bias_backward(G() + w.bv, acts.dv, T, KD);
  }
  be->zero(acts.dh, TC);
  linear_backward(acts.dh, w.wq, w.lq, dq, a.h1, acts, T, C, QD);
  linear_backward(acts.dh, w.wk, w.lk, dk, a.h1, acts, T, C, KD);
  linear_backward(acts.dh, w.wv, w.lv, acts.dv, a.h1, acts, T, C, KD);
  be->rmsnorm_backward(dresid, gw(w.ln1), acts.dh, x, P + w.ln1, a.rstd1, T, C);  // dresid = d x
}

Status Model::Impl::set_replay(const PackedBatch& b) {
  replaying = false;
  if (cfg.routing_replay != RoutingReplay::rollout || b.experts.empty()) return {};
  if (routing_width == 0) return invalid_input("packed batch: routing replay needs an MoE model (this one is dense)");
  const size_t T = b.tokens.size(), RW = static_cast<size_t>(routing_width), K = static_cast<size_t>(moe_cfg.K);
  if (b.experts.size() != T * RW)
    return invalid_input("packed batch: experts has " + std::to_string(b.experts.size()) + " ids, expected " +
                         std::to_string(T) + " tokens x routing width " + std::to_string(RW));
  const size_t layers = RW / K;
  replay.resize(T * RW);
  for (size_t t = 0; t < T; ++t)
    for (size_t o = 0; o < layers; ++o) {
      const int32_t* ids = b.experts.data() + t * RW + o * K;
      int32_t* dst = replay.data() + (o * T + t) * K;
      std::copy(ids, ids + K, dst);
      if (ids[0] < 0) continue;  // no record: the router's own top-k
      for (size_t k = 0; k < K; ++k) {
        bool ok = ids[k] >= 0 && ids[k] < moe_cfg.E;
        for (size_t j = 0; j < k && ok; ++j) ok = ids[j] != ids[k];
        if (!ok)
          return invalid_input("packed batch: experts of token " + std::to_string(t) + ", MoE layer " +
                               std::to_string(o) + " are not " + std::to_string(K) + " distinct ids in [0, " +
                               std::to_string(moe_cfg.E) + ") (id " + std::to_string(ids[k]) + ")");
      }
    }
  replaying = true;
  return {};
}

Result<const PackedMeta*> Model::Impl::meta_for_layer() {
  if (cfg.cache_packed_metadata) return &meta;
  TROUPE_TRY(build_packed_meta(&layer_meta, batch, HD, cfg.rope_theta, d_inv_freq(), *be));
  ++meta_builds;
  return &layer_meta;
}

// ---- training forward / backward ------------------------------------------------------------------

Status Model::Impl::forward(const PackedBatch& b, bool need_targets) {
  TROUPE_TRY(quant_ready());
  if (sliced() && !ep_exchange)
    return invalid_input("policy.moe.expert_parallel: this model holds expert block " + std::to_string(eshard.shard) +
                         " of " + std::to_string(eshard.shards) +
                         " of each MoE layer; its forwards run with the expert-parallel group (set_expert_exchange)");
  TROUPE_TRY(validate_packed_batch(b, V, need_targets));
  const int T = static_cast<int>(b.tokens.size());
  const size_t TC = static_cast<size_t>(T) * C;
  batch.tokens.assign(b.tokens.begin(), b.tokens.end());
  batch.cu_seqlens.assign(b.cu_seqlens.begin(), b.cu_seqlens.end());
  if (b.targets.empty())
    batch.targets.assign(T, -1);
  else
    batch.targets.assign(b.targets.begin(), b.targets.end());
  const bool ckpt = cfg.activation_checkpointing;
  // A training forward whose backward never ran may still have offload copies reading the arena's
  // layer inputs (forward leaves the last ones in flight): finish them before the arena is reused.
  if (offload && !offload_clean) offload->synchronize();
  // Offload only for training forwards (forward_logits has no backward to reload for).
  offload_step = cfg.offload_activations && need_targets;
  if (offload_step) {
    if (!offload || !offload_clean || offload->options().max_floats < TC) {
      k::OffloadOptions o;
      o.num_layers = L;
      o.max_floats = std::max(TC, offload ? offload->options().max_floats : size_t{0});
      o.double_buffer = cfg.offload_double_buffer;
      if (offload) offload->synchronize();  // nothing may still write into the old store
      if (engine) {
        TROUPE_ASSIGN_OR_RETURN(offload, k::ActivationOffload::create(*engine, o));
      } else {
        TROUPE_ASSIGN_OR_RETURN(offload, be->make_layer_offload(o));
      }
    }
    offload_clean = false;
  }
  if (cfg.cache_packed_metadata) {  // once per batch, before anything needs it (the arena's attention scratch)
    TROUPE_TRY(build_packed_meta(&meta, batch, HD, cfg.rope_theta, d_inv_freq(), *be));
    ++meta_builds;
  }
  int max_seqlen = cfg.cache_packed_metadata ? meta.max_seqlen : 0;
  if (!cfg.cache_packed_metadata)
    for (size_t s = 0; s + 1 < batch.cu_seqlens.size(); ++s)
      max_seqlen = std::max(max_seqlen, batch.cu_seqlens[s + 1] - batch.cu_seqlens[s]);
  // Under offload the layer inputs live in a ring of offload_ring buffers: x_l's offload copy may
  // run on while layers l..l+ring-2 compute; it is waited for only before layer l+ring-1 writes
  // x_{l+ring} into the same buffer (or, for the last ones, before backward reloads it).
  offload_ring = offload_step ? std::min(L + 1, kOffloadRing) : L + 1;
  TROUPE_ASSIGN_OR_RETURN(acts, carve(arena, T, max_seqlen, offload_ring, ckpt ? 1 : L, true));
  peak_bytes = std::max(peak_bytes, acts.floats * sizeof(float) + (offload_step ? offload->reload_buffer_bytes() : 0));
  TROUPE_TRY(set_replay(b));
  TROUPE_ASSIGN_OR_RETURN(d_tokens, stage_ints(tokens_dev, batch.tokens.data(), batch.tokens.size()));
  TROUPE_ASSIGN_OR_RETURN(d_targets, stage_ints(targets_dev, batch.targets.data(), batch.targets.size()));
  hook_step = hook && need_targets;  // training forwards only (and their backward)
  if (hook_step) TROUPE_TRY(need(ParamHook::kEmbedGroup));
  be->embedding_forward(acts.resid[0], d_tokens, P() + wte, T, C);
  if (hook_step) TROUPE_TRY(done(ParamHook::kEmbedGroup, false));
  routing.assign(static_cast<size_t>(T) * routing_width, -1);
  routing_out = routing_width > 0 ? routing.data() : nullptr;  // not during backward's recompute
  for (int l = 0; l < L; ++l) {
    TROUPE_ASSIGN_OR_RETURN(const PackedMeta* mp, meta_for_layer());
    const PackedMeta& m = *mp;
    const bool off = offload_step && offload->offloaded(l);
    float* x = acts.resid[l % offload_ring];
    float* x_out = acts.resid[(l + 1) % offload_ring];
    // x_out's buffer last held x_{l+1-ring}: its offload copy must be done before we overwrite it.
    const int reused = l + 1 - offload_ring;
    if (offload_step && reused >= 0 && offload->offloaded(reused)) TROUPE_TRY(offload->offload_wait(reused));
    if (off) TROUPE_TRY(offload->offload_begin(l, x, TC));  // copy overlaps this and later layers
    if (hook_step) TROUPE_TRY(need(l));
    layer_forward(l, x, x_out, acts.ws[ckpt ? 0 : l], acts, m, T, nullptr);
    if (hook_step) TROUPE_TRY(done(l, false));
  }
  routing_out = nullptr;
  const float* xL = layer_input(L);
  if (hook_step) TROUPE_TRY(need(L));  // held through the head's forward and backward
  be->rmsnorm_forward(acts.final_norm_out, acts.rstdf, xL, P() + wnorm, T, C, cfg.rms_norm_eps);
  aux_loss = 0;
  if (cfg.router_aux_loss_coef > 0)
    for (int l = 0; l < L; ++l)
      if (layers[l].moe) aux_loss += cfg.router_aux_loss_coef * moe_stats[l].aux_loss;
  return ep_take();
}

Status Model::Impl::backward(const float* dlogp, const float* dentropy) {
  TROUPE_TRY(check_trainable_base());
  if (!have_train_forward)
    return make_error(ErrorCode::internal, "backward_train called without a forward_train before it");
  have_train_forward = false;  // saved activations are consumed (recompute may overwrite them)
  const int T = acts.T;
  const size_t TC = static_cast<size_t>(T) * C;
  const float* P = this->P();
  // The caller's host arrays, copied to the device (null stays null: zeros).
  auto upload_row = [&](float* dst, const float* host) -> const float* {
    if (!host) return nullptr;
    be->copy_host_to_device(dst, host, sizeof(float) * T);
    return dst;
  };
  const float* dlp = upload_row(acts.dlogp_in, dlogp);
  const float* dent = upload_row(acts.dent_in, dentropy);
  if (chunked_head()) {  // each chunk's logits recomputed, its gradient accumulated into dh and the head
    be->zero(acts.dh, TC);
    be->chunked_logprob_backward(acts.dh, gw(wlm), dlp, dent, acts.final_norm_out, P + wlm, acts.lse_out,
                                 acts.ent_saved, d_targets, temperature, T, C, V, cfg.logprob_chunk, acts.logits);
  } else {
    be->logprob_backward(acts.dlogits, dlp, dent, acts.logits, acts.lse_out, d_targets, temperature, T, V);
    be->zero(acts.dh, TC);
    be->matmul_backward(acts.dh, gw(wlm), acts.dlogits, acts.final_norm_out, P + wlm, T, C, V);
  }
  return backward_body();
}

Status Model::Impl::backward_body() {
  const int T = acts.T;
  const size_t TC = static_cast<size_t>(T) * C;
  const float* P = this->P();
  be->zero(acts.dresid, TC);
  be->rmsnorm_backward(acts.dresid, gw(wnorm), acts.dh, layer_input(L), P + wnorm, acts.rstdf, T, C);
  if (hook_step) TROUPE_TRY(done(L, true));
  const bool ckpt = cfg.activation_checkpointing;
  const float daux = cfg.router_aux_loss_coef;
  for (int l = L - 1; l >= 0; --l) {
    TROUPE_ASSIGN_OR_RETURN(const PackedMeta* mp, meta_for_layer());
    const PackedMeta& m = *mp;
    const LayerActs& a = acts.ws[ckpt ? 0 : l];
    const bool off = offload_step && offload->offloaded(l);
    const float* x = layer_input(l);
    if (off) {
      // Offload copies still in flight from the forward end here at the latest (never later than
      // the reload, which the FIFO copy engine queues behind them, so this wait costs nothing).
      TROUPE_TRY(offload->offload_wait(l));
      TROUPE_ASSIGN_OR_RETURN(x, offload->reload_wait(l));
    }
    if (hook_step) TROUPE_TRY(need(l));
    // Prefetch layer l-1's input into the other reload buffer while layer l runs.
    if (offload_step && offload->offloaded(l - 1)) TROUPE_TRY(offload->reload_begin(l - 1));
    // Under checkpointing the workspace still holds the last layer's forward; earlier layers are
    // recomputed from their saved input (the output goes to a throwaway buffer).
    // Without the cache the recompute is a pass of its own and rebuilds the metadata too.
    if (ckpt && l != L - 1) {
      const PackedMeta* rm = mp;
      if (!cfg.cache_packed_metadata) {
        TROUPE_ASSIGN_OR_RETURN(rm, meta_for_layer());
      }
      layer_forward(l, x, acts.x_recompute, a, acts, *rm, T, nullptr);
    }
    layer_backward(l, x, a, acts, m, T, acts.dresid, layers[l].moe ? daux : 0.0f);
    if (hook_step) TROUPE_TRY(done(l, true));
    if (off) TROUPE_TRY(offload->reload_release(l));
  }
  if (!lora) be->embedding_backward(G() + wte, acts.dresid, d_tokens, T, C);  // frozen under LoRA
  if (offload_step) offload_clean = true;
  return ep_take();
}

Status Model::Impl::ep_idle_pass(bool with_backward) {
  if (!ep_exchange) return make_error(ErrorCode::internal, "expert_parallel_idle_pass without an exchange");
  auto serve_forward = [&](int l) { return be->moe_ep_serve_forward(moe_call_weights(l), moe_cfg, ep_group(l)); };
  // A training pass's hook calls too (learner.shard parameters: the idle rank takes part in each
  // group's gather and each layer's gradient reduce-scatter, in forward_train/backward_train's order).
  const bool hooked = hook && with_backward;
  if (hooked) TROUPE_TRY(need(ParamHook::kEmbedGroup));
  if (hooked) TROUPE_TRY(done(ParamHook::kEmbedGroup, false));
  for (int l = 0; l < L; ++l) {
    if (hooked) TROUPE_TRY(need(l));
    if (layers[l].moe) TROUPE_TRY(serve_forward(l));
    if (hooked) TROUPE_TRY(done(l, false));
  }
  if (hooked) TROUPE_TRY(need(L));
  if (hooked) TROUPE_TRY(done(L, true));
  for (int l = L - 1; l >= 0 && with_backward; --l) {  // backward_body's order: checkpointing recomputes a layer first
    if (hooked) TROUPE_TRY(need(l));
    if (layers[l].moe && cfg.activation_checkpointing && l != L - 1) TROUPE_TRY(serve_forward(l));
    if (layers[l].moe)
      TROUPE_TRY(be->moe_ep_serve_backward(moe_call_grads(l), moe_call_weights(l), moe_cfg, ep_group(l)));
    if (hooked) TROUPE_TRY(done(l, true));
  }
  return {};
}

// ---- Model (public API forwards to Impl) ----------------------------------------------------------

Result<Model> Model::create(const ModelConfig& cfg, uint64_t seed) {
  TROUPE_TRY(validate_model_config(cfg));
  TROUPE_ASSIGN_OR_RETURN(const k::Backend* be, k::backend_for(cfg.device));
  ModelConfig base = cfg;
  base.lora = LoraConfig{};  // the base first; enable_lora adds the adapters over it
  auto impl = std::make_unique<Impl>(base, *be);
  TROUPE_TRY(impl->check_quant_shapes());
  TROUPE_TRY(impl->alloc_params());
  TROUPE_TRY(impl->init_params(seed));
  if (cfg.base_dtype != BaseDtype::gguf) TROUPE_TRY(impl->sync_head_quant());  // gguf: the file's head
  if (cfg.lora.enabled()) TROUPE_TRY(impl->enable_lora(cfg.lora, seed));
  return Model(std::move(impl));
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

const ModelConfig& Model::config() const { return impl_->cfg; }
void Model::set_batch_invariant(bool on) { impl_->cfg.batch_invariant = on; }
// params()/grads() and the calls beside them work on the trainable arena: the adapters under LoRA
// (Impl::lparams/lgrads), else the base (params/grads). Both keep a host mirror on a device backend.
namespace {
struct TrainArena {
  kernels::Buffer& params;
  kernels::Buffer& grads;
  HostMirror& host_params;
  std::vector<float>& host_grads;
  bool& params_host_newer;
  bool& grads_host_newer;
  bool& grads_device_newer;
  bool& params_device_newer;
  size_t n;
};
TrainArena train_arena(Model::Impl& m) {
  if (m.lora)
    return {m.lparams, m.lgrads, m.host_lparams, m.host_lgrads, m.lparams_host_newer, m.lgrads_host_newer,
            m.lgrads_device_newer, m.lparams_device_newer, m.n_lora};
  return {m.params, m.grads, m.host_params, m.host_grads, m.params_host_newer, m.grads_host_newer,
          m.grads_device_newer, m.params_device_newer, m.n_params};
}
}  // namespace

const std::vector<TensorSpec>& Model::tensors() const { return impl_->lora ? impl_->lora_table : impl_->table; }
const TensorSpec* Model::find_tensor(std::string_view name) const {
  for (const auto& t : tensors())
    if (t.name == name) return &t;
  return nullptr;
}
std::span<float> Model::params() {
  Impl& m = *impl_;
  ++m.params_writes;
  TrainArena a = train_arena(m);
  if (!m.mirrored) return {m.lora ? m.LP() : m.P(), a.n};
  m.pull(a.params, a.host_params, &a.params_device_newer);
  a.params_host_newer = true;  // the caller may write: the next op that reads the weights uploads them
  return a.host_params;
}
std::uint64_t Model::params_writes() const { return impl_->params_writes; }
std::span<const float> Model::params() const {
  Impl& m = *impl_;
  TrainArena a = train_arena(m);
  if (!m.mirrored) return {m.lora ? m.LP() : m.P(), a.n};
  m.pull(a.params, a.host_params, &a.params_device_newer);
  return a.host_params;
}
std::span<const float> Model::grads() const {
  Impl& m = *impl_;
  TrainArena a = train_arena(m);
  if (!m.mirrored) return {a.grads.floats(), a.n};
  if (a.grads_device_newer) {  // what backward accumulated since the last download
    for (const auto& [b, e] : m.mapped(a.grads))
      m.be->copy_device_to_host(a.host_grads.data() + b, a.grads.floats() + b, sizeof(float) * (e - b));
    a.grads_device_newer = false;
  }
  return a.host_grads;
}
std::span<float> Model::grads() {
  Impl& m = *impl_;
  if (!m.mirrored) return {m.lora ? m.LG() : m.G(), train_arena(m).n};
  std::as_const(*this).grads();
  TrainArena a = train_arena(m);
  a.grads_host_newer = true;  // the caller may write: the next backward uploads them first
  return a.host_grads;
}
const kernels::Backend& Model::backend() const { return *impl_->be; }
Status Model::set_params(std::span<const float> flat) {
  Impl& m = *impl_;
  TrainArena a = train_arena(m);
  if (flat.size() != a.n)
    return invalid_input("set_params: got " + std::to_string(flat.size()) + " floats, the model has " +
                         std::to_string(a.n) + (m.lora ? " (LoRA adapters)" : ""));
  ++m.params_writes;
  a.host_params.settle();  // no copy into the mirror is still reading the arena written below
  for (const auto& [b, e] : m.mapped(a.params))
    m.be->copy_host_to_device(a.params.floats() + b, flat.data() + b, sizeof(float) * (e - b));
  m.weights_written(a.params);
  if (m.mirrored) {
    if (flat.data() != a.host_params.data()) std::copy(flat.begin(), flat.end(), a.host_params.begin());
    a.params_host_newer = a.params_device_newer = false;
  }
  if (!m.lora) TROUPE_TRY(m.sync_head_quant());  // a quantized base's sampling head follows its weights
  return {};
}
Model::DeviceArena Model::device_train_arena() {
  Impl& m = *impl_;
  // A quantized base without adapters keeps a sampling head beside its weights (set_params
  // refreshes it), so its optimizer stays on the host.
  if (!m.mirrored || (!m.lora && m.quant_base())) return {};
  TrainArena a = train_arena(m);
  a.host_params.order_writes();  // a refresh of the mirror still copying reads the weights first
  return {m.lora ? m.LP() : m.P(), m.lora ? m.LG() : m.G(), a.n};  // the host's writes go up first
}
void Model::refresh_host_mirror(size_t piece_floats) {
  Impl& m = *impl_;
  TrainArena a = train_arena(m);
  if (!m.mirrored || !a.params_device_newer) return;
  a.host_params.refresh_async(a.params.floats(), std::max<size_t>(piece_floats, 1), m.mapped(a.params));
  a.params_device_newer = false;
}
const float* Model::host_params_until(size_t end) {
  Impl& m = *impl_;
  TrainArena a = train_arena(m);
  if (!m.mirrored) return m.lora ? m.LP() : m.P();
  if (a.params_device_newer) refresh_host_mirror();
  return a.host_params.settle_until(std::min(end, a.n));
}
void Model::device_params_written() {
  Impl& m = *impl_;
  TrainArena a = train_arena(m);
  ++m.params_writes;
  m.weights_written(a.params);
  if (m.mirrored) a.params_device_newer = true;
}
Status Model::all_reduce_grads(kernels::DeviceCollective& c) {
  Impl& m = *impl_;
  try {
    // G()/LG(): the host's writes go up first; the sum is newer than the mirror
    c.all_reduce_sum(m.lora ? m.LG() : m.G(), train_arena(m).n);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, std::string("gradient all-reduce on the device: ") + e.what());
  }
  return {};
}
void Model::scale_grads(double s) {
  Impl& m = *impl_;
  float* g = m.lora ? m.LG() : m.G();  // G()/LG(): the host's writes go up first
  for (const auto& [b, e] : m.mapped(train_arena(m).grads)) m.be->scale(g + b, e - b, s);
}
void Model::set_param_hook(ParamHook* hook) { impl_->hook = hook; }
Status Model::make_train_arena_sparse() {
  Impl& m = *impl_;
  if (m.sparse_train) return {};
  if (!m.mirrored || m.lora || m.quant_base() || m.be->sparse_granularity() == 0)
    return invalid_input(std::string("sparse weights: a device backend with sparse buffers and full-parameter "
                                     "training of an fp32 base (backend ") +
                         std::string(m.be->name()) + (m.lora ? ", LoRA on" : "") + (m.quant_base() ? ", quantized base" : "") +
                         ")");
  const size_t bytes = sizeof(float) * m.n_params;
  TROUPE_ASSIGN_OR_RETURN(auto params, m.be->alloc_sparse(bytes, "the weights (sparse, " + std::to_string(m.n_params) + " floats)"));
  TROUPE_ASSIGN_OR_RETURN(auto grads, m.be->alloc_sparse(bytes, "the gradients (sparse, " + std::to_string(m.n_params) + " floats)"));
  TROUPE_TRY(m.be->map_sparse(params, 0, bytes));
  TROUPE_TRY(m.be->map_sparse(grads, 0, bytes));
  m.host_params.settle();  // (no copy still reads the old arena)
  m.be->copy_device_to_device(params.data(), m.P(), bytes);  // P()/G(): what the host wrote goes up first
  m.be->copy_device_to_device(grads.data(), m.G(), bytes);
  m.params = std::move(params);  // (the old buffers freed: the backend forgets their converted copies)
  m.grads = std::move(grads);
  m.sparse_train = true;
  return {};
}
bool Model::train_arena_sparse() const { return impl_->sparse_train; }
Status Model::map_train_arena(bool grads, size_t begin, size_t end, bool map) {
  Impl& m = *impl_;
  if (!m.sparse_train) return make_error(ErrorCode::internal, "map_train_arena: the arena is not sparse");
  const kernels::Buffer& b = grads ? m.grads : m.params;
  const size_t g = m.be->sparse_granularity(), bytes = b.bytes();
  const size_t lo = std::min(bytes, sizeof(float) * begin), hi = std::min(bytes, sizeof(float) * end);
  if (lo % g != 0 || (hi % g != 0 && hi != bytes))
    return make_error(ErrorCode::internal, "map_train_arena: [" + std::to_string(begin) + ", " + std::to_string(end) +
                                               ") is not whole granules of " + std::to_string(g) + " bytes");
  if (hi <= lo) return {};
  if (!map) {  // what the host wrote goes up first (its mapped parts): nothing may be pending once unmapped
    (void)(grads ? m.G() : m.P());
    return m.be->unmap_sparse(b, lo, hi - lo);
  }
  return m.be->map_sparse(b, lo, hi - lo);
}
Status Model::set_expert_exchange(kernels::MoeExchange* exchange) {
  Impl& m = *impl_;
  if (exchange) {
    if (m.routing_width == 0)
      return invalid_input("policy.moe.expert_parallel: the model has no MoE layer (num_experts = 0)");
    if (m.moe_cfg.E % exchange->size() != 0)
      return invalid_input("policy.moe.expert_parallel: " + std::to_string(exchange->size()) +
                           " does not divide num_experts = " + std::to_string(m.moe_cfg.E));
    if (m.sliced() && (exchange->size() != m.eshard.shards || exchange->rank() != m.eshard.shard))
      return invalid_input("policy.moe.expert_parallel: a model holding expert block " +
                           std::to_string(m.eshard.shard) + " of " + std::to_string(m.eshard.shards) +
                           " joined as rank " + std::to_string(exchange->rank()) + " of " +
                           std::to_string(exchange->size()));
    m.ep_states.resize(static_cast<size_t>(m.L));
  }
  m.ep_exchange = exchange;
  return {};
}
Status Model::expert_parallel_idle_pass(bool with_backward) { return impl_->ep_idle_pass(with_backward); }
const ExpertShardLayout* Model::expert_shards() const { return impl_->sliced() ? &impl_->eshard : nullptr; }

namespace {
// Why a model of cfg cannot hold expert block `shard` of `shards` (empty: it can). Any backend: a
// device's block goes through its copies as a whole model does.
Status check_expert_block(const ModelConfig& cfg, int shard, int shards, bool lora) {
  auto bad = [&](const std::string& why) { return invalid_input("policy.moe.expert_parallel: " + why); };
  bool any_moe = false;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) any_moe = any_moe || cfg.is_moe_layer(l);
  if (!any_moe) return bad("the model has no MoE layer (num_experts = 0)");
  if (shards < 2 || shard < 0 || shard >= shards || cfg.num_experts % shards != 0)
    return bad("expert block " + std::to_string(shard) + " of " + std::to_string(shards) + " of num_experts = " +
               std::to_string(cfg.num_experts));
  if (lora) return bad("not with LoRA adapters (policy.lora)");
  if (cfg.base_dtype != BaseDtype::fp32) return bad("not with a quantized base (policy.base_dtype)");
  return {};
}
}  // namespace

Result<Model> Model::create_expert_block(const ModelConfig& cfg, uint64_t seed, int shard, int shards) {
  TROUPE_TRY(validate_model_config(cfg));
  TROUPE_ASSIGN_OR_RETURN(const k::Backend* be, k::backend_for(cfg.device));
  TROUPE_TRY(check_expert_block(cfg, shard, shards, cfg.lora.enabled()));
  auto impl = std::make_unique<Impl>(cfg, *be, shard, shards);
  TROUPE_TRY(impl->alloc_params());
  TROUPE_TRY(impl->init_params(seed));
  return Model(std::move(impl));
}

Result<Model> Model::slice_experts(int shard, int shards) const {
  const Impl& m = *impl_;
  TROUPE_TRY(check_expert_block(m.cfg, shard, shards, m.lora));
  if (m.sliced()) return invalid_input("policy.moe.expert_parallel: the model is already a slice");
  auto impl = std::make_unique<Impl>(m.cfg, *m.be, shard, shards);
  TROUPE_TRY(impl->alloc_params());
  Model block(std::move(impl));
  // Through the host views (a device backend's mirrors: the whole model's brought down first, the
  // block's uploaded by its first op).
  const std::span<const float> whole = params();
  const std::span<float> local = block.params();
  for (const ArenaPiece& p : block.impl_->eshard.pieces)
    if (p.local != ArenaPiece::npos) std::copy_n(whole.data() + p.whole, p.size, local.data() + p.local);
  block.impl_->weights_written(block.impl_->params);
  return block;
}

void Model::zero_grads() {
  Impl& m = *impl_;
  TrainArena a = train_arena(m);
  for (const auto& [b, e] : m.mapped(a.grads)) m.be->zero(a.grads.floats() + b, e - b);
  if (m.mirrored) {
    std::fill(a.host_grads.begin(), a.host_grads.end(), 0.0f);
    a.grads_host_newer = a.grads_device_newer = false;
  }
}

namespace {
// LoRA dropout is in force for the duration of a training call (when armed), and only then.
class DropoutScope {
 public:
  explicit DropoutScope(Model::Impl& m) : m_(m), was_(m.dropout_now) { m.dropout_now = m.dropout_armed; }
  ~DropoutScope() { m_.dropout_now = was_; }
  DropoutScope(const DropoutScope&) = delete;
  DropoutScope& operator=(const DropoutScope&) = delete;

 private:
  Model::Impl& m_;
  bool was_;
};
}  // namespace

Status Model::forward_train(const PackedBatch& batch, float temperature, float* logp, float* entropy) {
  const OpScopes scopes(impl_->cfg);
  const DropoutScope dropout(*impl_);
  impl_->have_train_forward = false;
  if (!(temperature > 0.0f) || !std::isfinite(temperature))
    return invalid_input("forward_train: temperature must be > 0, got " + std::to_string(temperature));
  TROUPE_TRY(impl_->forward(batch, true));
  Impl& m = *impl_;
  m.temperature = temperature;
  const int T = m.acts.T;
  if (m.chunked_head()) {  // policy.logprob_chunk: no (T, V) logits buffer
    m.be->chunked_logprob_forward(m.acts.logp_out, m.acts.ent_saved, m.acts.lse_out, m.acts.final_norm_out,
                                  m.P() + m.wlm, m.d_targets, temperature, T, m.C, m.V, m.cfg.logprob_chunk,
                                  m.acts.logits);
  } else {
    m.be->matmul_forward(m.acts.logits, m.acts.final_norm_out, m.P() + m.wlm, T, m.C, m.V);
    m.be->logprob_forward(m.acts.logp_out, m.acts.ent_saved, m.acts.lse_out, m.acts.logits, m.d_targets, temperature,
                          T, m.V);
  }
  if (logp) m.be->copy_device_to_host(logp, m.acts.logp_out, sizeof(float) * T);
  if (entropy) m.be->copy_device_to_host(entropy, m.acts.ent_saved, sizeof(float) * T);
  m.have_train_forward = true;
  return {};
}
Status Model::forward_backward_train(const PackedBatch& batch, float temperature, float* logp, float* entropy,
                                     float* dlogp, float* dentropy, const kernels::RowLossGrad& grad) {
  Impl& m = *impl_;
  TROUPE_TRY(m.check_trainable_base());
  const DropoutScope dropout(m);
  if (!m.chunked_head() || !m.be->host_visible()) {  // nothing to fuse (or grad cannot read the outputs)
    TROUPE_TRY(forward_train(batch, temperature, logp, entropy));
    if (!batch.tokens.empty()) grad(0, static_cast<int>(batch.tokens.size()));
    return backward_train(dlogp, dentropy);
  }
  const OpScopes scopes(m.cfg);
  m.have_train_forward = false;
  if (!(temperature > 0.0f) || !std::isfinite(temperature))
    return invalid_input("forward_backward_train: temperature must be > 0, got " + std::to_string(temperature));
  if (!logp || !dlogp) return invalid_input("forward_backward_train: logp and dlogp are required");
  TROUPE_TRY(m.forward(batch, true));
  m.temperature = temperature;
  const int T = m.acts.T;
  // The head once over tiles of rows (kernels::chunked_logprob_fused): logits, log-softmax, grad,
  // the logits gradient and both GEMM products, no recompute.
  m.be->zero(m.acts.dh, static_cast<size_t>(T) * m.C);
  m.be->chunked_logprob_fused(logp, entropy ? entropy : m.acts.ent_saved, m.acts.lse_out, m.acts.dh, m.gw(m.wlm),
                              dlogp, dentropy, grad, m.acts.final_norm_out, m.P() + m.wlm, m.d_targets,
                              temperature, T, m.C, m.V, m.cfg.logprob_chunk, m.acts.logits);
  return m.backward_body();
}

Status Model::backward_train(const float* dlogp, const float* dentropy) {
  const OpScopes scopes(impl_->cfg);  // the recompute is a forward
  const DropoutScope dropout(*impl_);
  return impl_->backward(dlogp, dentropy);
}
float Model::last_aux_loss() const { return impl_->aux_loss; }

Status Model::forward_logits(const PackedBatch& batch, float* logits) {
  const OpScopes scopes(impl_->cfg);
  impl_->have_train_forward = false;
  TROUPE_TRY(impl_->forward(batch, false));
  Impl& m = *impl_;
  const int T = m.acts.T, cols = m.head_cols();
  for (int c0 = 0; c0 < m.V; c0 += cols) {  // one vocabulary chunk at a time through the arena's head buffer
    const int n = std::min(cols, m.V - c0);
    m.be->matmul_forward(m.acts.logits, m.acts.final_norm_out, m.P() + m.wlm + static_cast<size_t>(c0) * m.C, T, m.C,
                         n);
    if (n == m.V) {
      m.be->copy_device_to_host(logits, m.acts.logits, sizeof(float) * T * m.V);
    } else {
      for (int t = 0; t < T; ++t)
        m.be->copy_device_to_host(logits + static_cast<size_t>(t) * m.V + c0, m.acts.logits + static_cast<size_t>(t) * n,
                                  sizeof(float) * n);
    }
  }
  return {};
}

Status Model::forward_hidden(const PackedBatch& batch, std::span<const int32_t> rows, float* out) {
  const int T = static_cast<int>(batch.tokens.size());
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= T)
      return invalid_input("forward_hidden: row " + std::to_string(i) + " is position " + std::to_string(rows[i]) +
                           ", outside the batch's " + std::to_string(T) + " tokens");
  const OpScopes scopes(impl_->cfg);
  impl_->have_train_forward = false;
  TROUPE_TRY(impl_->forward(batch, false));
  const Impl& m = *impl_;
  for (size_t i = 0; i < rows.size(); ++i)
    m.be->copy_device_to_host(out + i * m.C, m.acts.final_norm_out + static_cast<size_t>(rows[i]) * m.C,
                              sizeof(float) * m.C);
  return {};
}

int Model::routing_width() const { return impl_->routing_width; }
std::span<const int32_t> Model::last_routing() const { return impl_->routing; }

uint64_t Model::packed_meta_builds() const { return impl_->meta_builds; }
size_t Model::activation_peak_bytes() const { return impl_->peak_bytes; }
kernels::CopyEngine* Model::offload_engine() { return impl_->engine.get(); }
const kernels::ActivationOffload* Model::activation_offload() const {
  return dynamic_cast<const kernels::ActivationOffload*>(impl_->offload.get());
}

}  // namespace troupe::policy
