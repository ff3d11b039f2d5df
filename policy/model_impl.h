// Internals of troupe::policy::Model shared by model.cpp and its tests: the parameter offsets of
// each layer, the per-batch activation layout and the KV-cache view. Not a public header.
// Invariant: every pointer in Acts points into one arena Buffer of the model's backend and is
// valid until the next carve().
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/compute_dtype.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/kernels/offload.h"
#include "troupe/policy/model.h"

namespace troupe::policy {

// One LoRA adapter: float offsets of A (r, in) and B (out, r) in the adapter arena.
struct LoraSlot {
  bool on = false;
  size_t a = 0, b = 0;
};

// Float offsets of one layer's tensors in the parameter (and gradient) arena.
struct LayerW {
  size_t ln1 = 0, wq = 0, wk = 0, wv = 0, wo = 0, qn = 0, kn = 0, ln2 = 0;
  size_t bq = 0, bk = 0, bv = 0, bo = 0;  // attention biases (qkv_bias / o_proj_bias)
  bool moe = false;
  size_t wg = 0, wu = 0, wd = 0;           // dense SwiGLU: (I, C), (I, C), (C, I)
  size_t router = 0, eg = 0, eu = 0, ed = 0;  // (E, C); experts (E, H, C), (E, H, C), (E, C, H)
  size_t sg = 0, su = 0, sd = 0;           // shared expert (H_shared, C), (H_shared, C), (C, H_shared)
  size_t sgate = 0;                        // qwen2_moe shared_expert_gate (1, C)
  // LoRA adapters (adapter arena): attention, and the dense MLP's or the gated shared expert's
  // gate/up/down projections (a layer has one or the other).
  LoraSlot lq, lk, lv, lo, lg, lu, ld;
  // Routed experts' adapters: a = expert 0's gate A; expert e's six tensors at a + e * stride.
  LoraSlot lx;
};

// What one layer's forward saves for its backward (T = tokens of the batch).
struct LayerActs {
  float *h1, *x2, *h2;          // (T, C): norm1 out, residual after attention, norm2 out
  float *rstd1, *rstd2;         // (T)
  float *q, *qr, *att;          // (T, NH*HD): q proj, q after q_norm + RoPE, attention out
  float *k, *kr, *v;            // (T, NKV*HD)
  float *lse;                   // (T, NH)
  float *rstdq, *rstdk;         // (T*NH), (T*NKV) q/k norm
  float *g, *u, *a;             // dense FFN (T, I) each
  float *moe_saved;             // MoE layers: moe_saved_floats(cfg, T) (aliases g/u/a)
  // qwen2_moe gated shared expert (after moe_saved): gate/up/act (T, HS), output (T, C), gate logit (T).
  float *sg = nullptr, *su = nullptr, *sa = nullptr, *so = nullptr, *sgl = nullptr;
};

// Float offsets of the activation arena's regions for one batch size (Model::Impl::arena_layout):
// what carve points Acts into, and what the memory planner sizes without allocating.
struct ArenaLayout {
  size_t floats = 0;  // the whole arena
  std::vector<size_t> resid, ws;
  size_t u = 0, rstdf = 0, lse = 0, ent = 0, logp = 0, y = 0, attn_scratch = 0, attn_scratch_floats = 0, lora = 0;
  size_t lora_x = 0, lora_dx = 0;  // LoRA dropout's dropped input and its gradient (dropout > 0)
  size_t dresid = 0, dh = 0, dlogp = 0, dent = 0;  // backward scratch (with_grads only)
};

// The activation arena carved for one batch size.
struct Acts {
  int T = 0;
  size_t floats = 0;
  std::vector<float*> resid;    // layer inputs x_0..x_L (T, C) (inference: a ping-pong pair)
  std::vector<LayerActs> ws;    // one per layer, or one shared under checkpointing
  float *final_norm_out = nullptr, *rstdf = nullptr;  // final RMSNorm output (T, C) and its rstd (T)
  // (T, V) logits, or with a chunked head (T, chunk) scratch of one vocabulary chunk; (T) lse, and
  // the entropy a chunked backward reads (T)
  float *logits = nullptr, *lse_out = nullptr, *ent_saved = nullptr;
  // (T) each: the log-probs forward_train hands back, and backward's dlogp/dentropy (device copies
  // of the caller's host arrays).
  float *logp_out = nullptr, *dlogp_in = nullptr, *dent_in = nullptr;
  float *y = nullptr, *moe_scratch = nullptr;                                   // FFN output, MoE scratch
  float* lora_scratch = nullptr;  // LoRA: lora_scratch_floats(T, r) (u and du of one projection)
  // LoRA dropout (lora.dropout > 0): the dropped input of one projection and its gradient,
  // (T, widest input) each.
  float *lora_x = nullptr, *lora_dx = nullptr;
  float* attn_scratch = nullptr;  // score tiles, attention_scratch_floats(max_seqlen, threads)
  size_t attn_scratch_floats = 0;
  // Backward scratch (null in inference arenas).
  float *dresid = nullptr, *dh = nullptr, *datt = nullptr, *dq = nullptr, *dk = nullptr,
        *dv = nullptr, *dqr = nullptr, *dkr = nullptr, *dg = nullptr, *du = nullptr, *da = nullptr,
        *dlogits = nullptr, *x_recompute = nullptr;
};

// KV cache of a DecodeSlots (decode_slots.cpp): (L, slots, cache_len, NKV, HD) for keys and for values.
struct KvCtx {
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  size_t layer_stride = 0;
  int cache_len = 0;
  bool decode = false;            // false: packed prefill (write cache, packed attention)
  const int32_t* slot = nullptr;  // (T) cache slot of each row
  const int32_t* pos = nullptr;   // (T) position written
  const int32_t* kv_len = nullptr;  // (T) decode: keys visible
};

// The per-thread modes the model's ops run under (batch invariance, GEMM precision), set by every
// public entry point for its duration.
struct OpScopes {
  explicit OpScopes(const ModelConfig& c)
      : invariant(c.batch_invariant),
        dtype(c.compute_dtype, c.allow_tf32) {}
  kernels::BatchInvariantScope invariant;
  kernels::ComputeDtypeScope dtype;
};

// The host mirror of a device weight arena (Model::params() on a backend the host cannot read):
// pinned memory from the backend (HostBuffer) and the copies into it still in flight, one per
// piece of kPiece floats, queued on the backend's copy queue after the optimizer step that wrote
// the arena. Invariant: the host touches the memory only through data()/begin()/end()/the spans,
// which wait for every copy first, or settle_until(end), which waits for the pieces below end.
struct HostMirror {
  static constexpr size_t kPiece = size_t{1} << 22;  // floats per copy (16 MiB)
  const kernels::Backend* be = nullptr;
  kernels::HostBuffer buf;
  mutable std::vector<std::pair<size_t, kernels::CopyTicket>> pending;  // (piece start, its copy), ascending

  Status allocate(const kernels::Backend& b, size_t n, const std::string& what) {
    be = &b;
    pending.clear();
    TROUPE_ASSIGN_OR_RETURN(buf, b.alloc_host(n * sizeof(float), what));
    return {};
  }
  size_t size() const { return buf.num_floats(); }
  float* data() const {
    settle();
    return buf.floats();
  }
  float* begin() const { return data(); }
  float* end() const { return data() + size(); }
  operator std::span<float>() const { return {data(), size()}; }
  operator std::span<const float>() const { return {data(), size()}; }
  void settle() const { settle_until(size()); }
  // Waits for the copies of the pieces that start below end (copies land in order) and returns
  // the memory (valid to read below end).
  const float* settle_until(size_t end) const {
    size_t k = 0;
    while (k < pending.size() && pending[k].first < end) ++k;
    if (k > 0) be->wait_copy(pending[k - 1].second);
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(k));
    return buf.floats();
  }
  // Queues the copies of src (size() floats of device memory) in pieces of `piece` floats, within
  // `ranges` (ascending [begin, end) in floats: the mapped parts of a sparse arena) or all of it.
  void refresh_async(const float* src, size_t piece, const std::vector<std::pair<size_t, size_t>>& ranges) {
    pending.clear();  // earlier copies land before these (one in-order queue)
    for (const auto& [rb, re] : ranges)
      for (size_t b = rb; b < re; b += piece) {
        const size_t e = std::min(re, b + piece);
        pending.emplace_back(b, be->copy_to_host_async(buf.floats() + b, src + b, sizeof(float) * (e - b)));
      }
  }
  // Ops issued next (an optimizer step) may write the arena the copies read.
  void order_writes() const {
    if (!pending.empty()) be->order_after_copy(pending.back().second);
  }
};

struct Model::Impl {
  // shard/shards: the expert block this model holds (Model::slice_experts); 0/1 = every expert.
  Impl(const ModelConfig& c, const kernels::Backend& backend, int shard = 0, int shards = 1);
  ~Impl() {
    if (engine) engine->synchronize();  // no copy may still target the offload store being freed
  }
  void build_table();
  Status alloc_params();  // params and grads, zero-filled, on the backend
  Status init_params(uint64_t seed);
  // Layer l's MoE tensors at `base`: the parameter arena (kernels::MoeWeights) or the gradient
  // arena (kernels::MoeGrads), which share one layout.
  template <class Tensors>
  Tensors moe_tensors(int l, float* base) const;
  size_t layer_ws_floats(int T) const;
  size_t shared_saved_floats(int T) const {  // what the gated shared expert saves per layer
    return HS_gated > 0 ? static_cast<size_t>(T) * (3 * HS_gated + C + 1) : 0;
  }
  ArenaLayout arena_layout(int T, int max_seqlen, int n_resid, int n_ws, bool with_grads) const;
  Result<Acts> carve(kernels::Buffer& arena, int T, int max_seqlen, int n_resid, int n_ws, bool with_grads) const;
  void layer_forward(int l, const float* x, float* x_out, const LayerActs& a, const Acts& acts, const PackedMeta& m,
                     int T, const KvCtx* kv);
  void layer_backward(int l, const float* x, const LayerActs& a, const Acts& acts, const PackedMeta& m, int T,
                      float* dresid, float daux);
  void ffn_backward(int l, const LayerActs& a, const Acts& acts, int T, float* dresid, float daux);
  // A linear layer with its adapter: out = in . W^T (+ scale (in A^T) B^T when s.on), and its
  // backward: din += dout . W, dW += dout^T in (unless the base is frozen), the adapter's dA, dB.
  void linear_forward(float* out, const float* in, size_t w, const LoraSlot& s, const Acts& acts, int T, int IN,
                      int OUT) const;
  void linear_backward(float* din, size_t w, const LoraSlot& s, const float* dout, const float* in, const Acts& acts,
                       int T, int IN, int OUT) const;
  // Several linear layers of one input `in` (T, IN), e.g. q, k, v: linear_forward of each, in one
  // backend call (quant_projections_forward) when every base is quantized and no adapter needs
  // more than its plain low-rank path (no dropout, no served adapters).
  struct Projection {
    float* out;
    size_t w;
    const LoraSlot* s;
    int OUT;
  };
  void linear_forward_group(std::initializer_list<Projection> group, const float* in, const Acts& acts, int T,
                            int IN) const;
  Result<const PackedMeta*> meta_for_layer();
  Status forward(const PackedBatch& b, bool need_targets);  // up to the final norm (the head is the caller's)
  // Whether the LM head runs over the vocabulary in chunks (policy.logprob_chunk < V).
  bool chunked_head() const { return cfg.logprob_chunk > 0 && V > cfg.logprob_chunk; }
  int head_cols() const { return chunked_head() ? cfg.logprob_chunk : V; }
  Status backward(const float* dlogp, const float* dentropy);
  Status backward_body();  // from acts.dh (the head's input gradient) down: final norm, layers, embedding
  Status ep_idle_pass(bool with_backward);  // Model::expert_parallel_idle_pass

  ModelConfig cfg;
  const kernels::Backend* be = nullptr;  // every op, buffer and copy of the model goes through it
  int C = 0, NH = 0, NKV = 0, HD = 0, V = 0, L = 0, I = 0;
  bool qk = false, any_moe = false, any_dense = false;
  kernels::MoeConfig moe_cfg;
  int HS_gated = 0;             // qwen2_moe: shared expert size run beside the MoE kernel (else 0)
  std::vector<float> inv_freq;  // scaled RoPE's inverse frequencies (HD/2); empty = default RoPE

  std::vector<TensorSpec> table;
  std::vector<LayerW> layers;
  size_t wte = 0, wnorm = 0, wlm = 0, n_params = 0;
  kernels::Buffer params, grads, arena;  // (n_params) each, and the activation arena

  // State of the last training forward.
  PackedBatch batch;
  PackedMeta meta, layer_meta;
  Acts acts;
  float temperature = 1.0f;
  bool have_train_forward = false;
  std::vector<kernels::MoeStats> moe_stats;
  float aux_loss = 0;
  uint64_t meta_builds = 0;
  size_t peak_bytes = 0;
  // Routing record: while routing_out is set, each MoE layer's forward writes its tokens' top-k
  // expert ids (ascending) to routing_out[t * routing_width + moe_ordinal[l] * K + k]. The training
  // forward records into `routing` (T x routing_width); DecodeSlots into a scratch of its own.
  int routing_width = 0;          // (MoE layers) x K; 0 for a dense model
  std::vector<int> moe_ordinal;   // (L) index of layer l among the MoE layers (-1: dense)
  int32_t* routing_out = nullptr;
  std::vector<int32_t> routing;   // of the last forward_train / forward_logits
  // Routing replay of the current training batch (routing_replay and a batch with experts): per MoE
  // layer (ordinal) a (T, K) block of forced expert ids, -1 rows route as usual; used by every
  // training-forward layer call (backward's recompute too), never by KV-cache sampling.
  std::vector<int32_t> replay;
  bool replaying = false;
  Status set_replay(const PackedBatch& b);

  // Activation offload (offload_activations): layer inputs x_l go to the store in forward and come
  // back through the reload buffers in backward; the arena keeps a ring of layer inputs, so offload
  // copies run on under later layers' forward (see offload_ring).
  std::unique_ptr<kernels::CopyEngine> engine;
  std::unique_ptr<kernels::LayerOffload> offload;  // ActivationOffload on cpu; the backend's elsewhere
  bool offload_clean = true;  // false from a training forward until its backward completes
  bool offload_step = false;  // the last forward offloaded (training forward with offload on)
  // Layer-input ring under offload (x_l in resid[l % ring]); L + 1 (every input kept) otherwise.
  static constexpr int kOffloadRing = 4;
  int offload_ring = 2;
  const float* layer_input(int l) const { return acts.resid[l % offload_ring]; }
  // Device pointers to the weights and the gradients for the ops. On a device backend they first
  // upload what the host wrote through Model::params()/grads() (the host mirror below); G() also
  // marks the device gradients as newer than the mirror (its callers accumulate into them).
  float* P() const {
    if (params_host_newer) upload(params, host_params, &params_host_newer);
    return params.floats();
  }
  float* G() const {
    if (grads_host_newer) upload(grads, host_grads, &grads_host_newer);
    grads_device_newer = mirrored;
    return grads.floats();
  }
  // The host mirror of a weight arena after a device-side optimizer step wrote the arena
  // (Model::device_params_written): brought down once, on the first host read that needs it, or
  // earlier on the copy queue (Model::refresh_host_mirror), the read then waiting for it.
  void pull(const kernels::Buffer& src, HostMirror& dst, bool* flag) {
    if (*flag) dst.refresh_async(src.floats(), HostMirror::kPiece, mapped(src));
    *flag = false;
    dst.settle();
  }
  template <class Host>  // HostMirror (the weights) or std::vector<float> (the gradients)
  void upload(const kernels::Buffer& dst, const Host& src, bool* flag) const {
    for (const auto& [b, e] : mapped(dst))
      be->copy_host_to_device(dst.floats() + b, src.data() + b, sizeof(float) * (e - b));
    *flag = false;
    if (&dst == &params || &dst == &lparams) weights_written(dst);
  }
  // Every device-side write of a weight arena (params, lparams) tells the backend, which may keep
  // converted copies of the weights for its GEMMs (Backend::weights_written). Not a sparse arena:
  // a copy of it all would read what is not mapped (its GEMMs read the fp32 weights).
  void weights_written(const kernels::Buffer& w) const {
    if (sparse_train && (&w == &params || &w == &lparams)) return;
    be->weights_written(w.floats(), w.bytes() / sizeof(float));
  }
  // learner.shard parameters on a device (Model::make_train_arena_sparse): the trainable weights
  // and gradients are sparse buffers whose layers are mapped only while used. Every transfer
  // between them and their host mirrors, and every op over a whole arena, covers the parts mapped
  // now (mapped(): [begin, end) in floats, ascending; the whole buffer when not sparse).
  bool sparse_train = false;
  std::vector<std::pair<size_t, size_t>> mapped(const kernels::Buffer& b) const {
    std::vector<std::pair<size_t, size_t>> out;
    for (const auto& [lo, hi] : be->mapped_ranges(b)) out.emplace_back(lo / sizeof(float), hi / sizeof(float));
    return out;
  }
  // The base weights' gradient at float offset off: null once the base is frozen (LoRA), so the ops
  // compute input gradients only.
  float* gw(size_t off) const { return lora ? nullptr : G() + off; }

  // LoRA (Model::enable_lora): the adapter arena, laid out from lora_table (PEFT names), mirrored
  // on the host like the base arena where the backend is not host-visible. With it on, the base's
  // gradient buffer is freed; moe_sink takes the gradients the MoE kernel computes for the frozen
  // router and experts of one layer (thrown away).
  bool lora = false;
  int lora_r = 0;
  float lora_scale = 0;
  std::vector<TensorSpec> lora_table;
  size_t n_lora = 0;
  kernels::Buffer lparams, lgrads, moe_sink;
  HostMirror host_lparams;
  mutable std::vector<float> host_lgrads;
  mutable bool lparams_host_newer = false, lgrads_host_newer = false, lgrads_device_newer = false;
  bool lparams_device_newer = false;  // a device optimizer step wrote lparams after the mirror
  float* LP() const {
    if (lparams_host_newer) upload(lparams, host_lparams, &lparams_host_newer);
    return lparams.floats();
  }
  float* LG() const {
    if (lgrads_host_newer) upload(lgrads, host_lgrads, &lgrads_host_newer);
    lgrads_device_newer = mirrored;
    return lgrads.floats();
  }
  // LoRA dropout: armed by Model::set_lora_dropout (the learner, around its loss's forward and
  // backward), in force only inside forward_train / forward_backward_train / backward_train.
  bool dropout_armed = false, dropout_now = false;
  uint64_t dropout_seed = 0;
  bool dropout_applies(const LoraSlot& s, const Acts& a) const { return dropout_now && s.on && a.lora_x; }
  // The input of adapter s's low-rank path: `in`, or under dropout in * mask / (1 - p) in acts.lora_x.
  const float* lora_input(const float* in, const LoraSlot& s, const Acts& acts, size_t n) const;
  Status enable_lora(const LoraConfig& lc, uint64_t seed);
  void build_lora_table();

  // QLoRA's quantized base (cfg.base_dtype != fp32, quant_base.cpp): the linear weights q, k, v, o
  // and the dense MLP's / gated shared expert's gate, up, down live in qbase, one backend buffer of
  // blocks each; their LayerW field holds kQuantBit | index into qbase instead of an arena offset,
  // and their table entry is marked quantized (no arena floats). Under gguf a slot stays empty
  // (null data) until the loader sets it; the entry points refuse to run with one empty.
  static constexpr size_t kQuantBit = size_t(1) << 63;
  static bool is_quant(size_t w) { return (w & kQuantBit) != 0; }
  struct QuantSlot {
    std::string name;
    kernels::QuantWeights w;  // data points into buf (null until set)
    kernels::Buffer buf;
  };
  std::vector<QuantSlot> qbase;
  bool quant_base() const { return cfg.base_dtype != BaseDtype::fp32; }
  const kernels::QuantWeights& qw(size_t w) const { return qbase[w & ~kQuantBit].w; }
  size_t add_quant_slot(const std::string& name, int rows, int cols);  // the LayerW value
  Status check_quant_shapes() const;          // every slot holdable in the configured format
  Status set_quant(size_t index, kernels::QuantMatrix m);
  Status init_quant(size_t index, uint64_t* stream);  // N(0, 0.02) as init_params draws, quantized
  Status quant_ready() const;                 // no empty slot (a gguf base fully loaded)
  // The LM head in blocks for sampling (decode reads the head once per token): its values are also
  // the arena's head (sync_head_quant writes them back dequantized), so the learner's fp32 head and
  // the sampler's blocks hold the same weights. bf16 for bf16, q8_0 for q8_0/q4_k, the file's for
  // gguf (set by the loader; until then sampling reads the fp32 head).
  QuantSlot head_q;
  Status sync_head_quant();                   // blocks from the arena's head, then written back
  Status set_head_blocks(kernels::QuantMatrix m);
  std::string head_name() const { return cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"; }
  Status check_trainable_base() const;        // a quantized base trains only with LoRA
  kernels::MoeGrads moe_sink_grads(int l) const;  // layer l's MoE gradients pointed into moe_sink
  // Layer l's routed-expert adapters (kernels::MoeLoraWeights) in the adapter arena at `base`
  // (LP() or, for gradients, LG()); r = 0 when the layer has none.
  kernels::MoeLoraWeights moe_lora(int l, const float* base) const;
  kernels::MoeLoraGrads moe_lora_grads(int l, float* base) const;
  // What layer l's MoE kernel calls get: its weights with its expert adapters (if any), and the
  // gradients they fill (the sink under LoRA, where the base is frozen, plus the adapters').
  kernels::MoeWeights moe_call_weights(int l);
  kernels::MoeGrads moe_call_grads(int l);

  // Adapters served beside the base (Model::add_served_adapter, served_adapters.cpp): each its rank,
  // scale, arena and one slot per adapted linear layer, keyed by the base weight's float offset (the
  // `w` linear_forward gets). While row_adapter is set (DecodeSlots, for one pass: a host array of T
  // adapter ids, 0 = none), linear_forward adds each run of equal ids' low-rank delta.
  struct ServedAdapter {
    int r = 0;
    float scale = 0;
    kernels::Buffer params;
    std::vector<std::pair<size_t, LoraSlot>> slots;  // sorted by base offset
    const LoraSlot* find(size_t w) const;
  };
  std::vector<ServedAdapter> served;
  int served_max_r = 0;
  const int32_t* row_adapter = nullptr;
  void served_lora_forward(float* out, const float* in, size_t w, const Acts& acts, int T, int IN, int OUT) const;
  int scratch_rank() const { return std::max(lora ? lora_r : 0, served_max_r); }

  // Host mirror of params and grads where the backend is not host-visible (Model::params()).
  bool mirrored = false;
  ParamHook* hook = nullptr;
  bool hook_step = false;  // this training forward (and its backward) calls the hook  // set_param_hook: learner.shard parameters' per-layer gathers
  Status need(int group) { return hook ? hook->need(group) : Status{}; }
  Status done(int group, bool backward) { return hook ? hook->done(group, backward) : Status{}; }
  // set_expert_exchange: the MoE layers' expert-parallel group, a state per layer, the first error
  // of an exchange (layer_forward and ffn_backward return nothing; forward and backward report it).
  kernels::MoeExchange* ep_exchange = nullptr;
  // slice_experts: the expert block this model holds (shards 1: every expert) and its layout.
  ExpertShardLayout eshard;
  bool sliced() const { return eshard.shards > 1; }
  kernels::MoeExpertGroup ep_group(int l) {
    return {ep_exchange, &ep_states[static_cast<size_t>(l)], eshard.shard * (moe_cfg.E / eshard.shards)};
  }
  std::vector<kernels::MoeEpState> ep_states;
  Status ep_failed;
  void ep_note(Status st) {
    if (!st.ok() && ep_failed.ok()) ep_failed = std::move(st);
  }
  Status ep_take() { return std::exchange(ep_failed, Status{}); }
  HostMirror host_params;
  mutable std::vector<float> host_grads;
  mutable bool params_host_newer = false, grads_host_newer = false, grads_device_newer = false;
  bool params_device_newer = false;  // a device optimizer step wrote params after the mirror
  std::uint64_t params_writes = 0;  // Model::params_writes()
  // The host arrays ops read, copied to the device: RoPE's scaled inverse frequencies (null for
  // default RoPE) and the training batch's tokens and targets.
  kernels::Buffer inv_freq_dev, tokens_dev, targets_dev;
  const float* d_inv_freq() const { return inv_freq.empty() ? nullptr : inv_freq_dev.floats(); }
  const int32_t *d_tokens = nullptr, *d_targets = nullptr;
  // Copies n host ints into buf (grown as needed, at element offset `at`) and returns the device
  // address (valid until buf grows again: grow buf for every array of a pass first).
  Result<int32_t*> stage_ints(kernels::Buffer& buf, const int32_t* host, size_t n, size_t at = 0) const;
  // The (T, K) experts of MoE layer l's forward, written into routing_out (host) when it is set.
  void record_routing(int l, const LayerActs& a, int T);
  std::vector<int32_t> routing_tmp;
};

}  // namespace troupe::policy
