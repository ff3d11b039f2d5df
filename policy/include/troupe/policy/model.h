// The policy model API that learner/, actors/ and launch/ program against (policy/model.cpp implements it).
// Contract: parameters, gradients and activations each live in one flat fp32 arena laid out from
// one tensor table; gradients mirror parameters (same offsets), so zeroing, all-reduce, clipping,
// AdamW and checkpointing each touch one flat buffer. Training forward/backward run on a packed
// batch (several sequences concatenated, no padding; attention never crosses cu_seqlens).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"
#include "troupe/kernels/chunked_logprob.h"
#include "troupe/kernels/quant_matrix.h"
#include "troupe/policy/model_config.h"

namespace troupe::kernels {
class Backend;
class CopyEngine;
class ActivationOffload;
}  // namespace troupe::kernels

namespace troupe::kernels {
class MoeExchange;
}

namespace troupe::policy {

struct ModelConfig;  // sizes, MoE layout, optimizations switches — defined in model_config.h

// One named tensor in an arena: shape and float offset into the flat buffer.
struct TensorSpec {
  std::string name;  // Hugging Face name of the family, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats
  // QLoRA (policy.base_dtype other than fp32): a base linear weight held in quantized blocks, not
  // in the fp32 arena (offset unused); Model::base_quant_matrix reads it.
  bool quantized = false;
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
  // MoE routing replay (ModelConfig::routing_replay): empty, or (T x Model::routing_width()) the
  // expert ids to route each position to, per MoE layer in layer order, K per layer (a layer's K
  // distinct ids in [0, num_experts), or -1 first = the router's own top-k). Ignored with replay off.
  std::vector<int32_t> experts;
};

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  int max_new_tokens = 64;
  std::vector<int32_t> stop_tokens;  // e.g. EOS; the stop token is included in the output
  uint64_t seed = 0;
  // The RNG stream of each prompt (>= 0), so that a prompt's draws do not depend on which other
  // prompts share the call; empty = each prompt's index.
  std::vector<int32_t> streams;
  // Called before decode step t (t >= 1: the forward pass whose output samples each running
  // sequence's completion token t), between steps, on the calling thread. It may change the
  // model's parameters (set_params): the KV cache of the tokens before t stays as older weights
  // computed it. An error ends generate() with it. Empty = none.
  std::function<Status(int t)> before_decode_step;
};

// One adapter for Model::add_served_adapter: LoRA pairs keyed by the base weight they adapt (its
// Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight", a 2-D projection the layer runs
// as a linear layer: attention q k v o, the dense MLP's or the gated shared expert's gate up down),
// A (rank, in) and B (out, rank) row-major, out += scale · (x Aᵀ) Bᵀ.
struct ServedAdapterWeights {
  int rank = 0;
  float scale = 0;
  struct Pair {
    std::string weight;
    std::vector<float> a, b;
  };
  std::vector<Pair> pairs;
};

struct Generation {
  std::vector<int32_t> tokens;   // sampled tokens (stop token included when hit)
  std::vector<float> logprobs;   // log-prob of each sampled token under the sampling distribution
  bool stopped = false;          // true when a stop token ended it, false when max_new_tokens did (truncated)
  // MoE: (tokens x Model::routing_width()) the top-k expert ids (ascending) of every MoE layer at the
  // position whose output sampled each token, layer-major within a token; empty for a dense model.
  std::vector<int32_t> experts;
};

// Everything that describes one packed batch, computed once per batch (cache_packed_metadata) and
// shared read-only by every layer, forward, backward and recompute. The host arrays steer the
// model's loops; the ops read the device half, built with them on the model's backend.
struct PackedMeta {
  int T = 0;                         // tokens
  int S = 0;                         // sequences
  int max_seqlen = 0;
  std::vector<int32_t> cu_seqlens;   // (S+1)
  std::vector<int32_t> positions;    // (T) position of each token inside its sequence (RoPE)
  std::vector<int32_t> seq_ids;      // (T)
  std::vector<int32_t> seq_start;    // (T) attention block bounds: token t sees keys [seq_start[t], t]
  std::vector<int32_t> seq_end;      // (T) one past the last token of t's sequence
  // Device memory (one buffer of the backend, reused by the next build): what the ops read.
  kernels::Buffer dev;
  int32_t* d_cu_seqlens = nullptr;  // (S+1)
  int32_t* d_positions = nullptr;   // (T)
  float* rope_cos = nullptr;        // (T, head_dim/2)
  float* rope_sin = nullptr;        // (T, head_dim/2)
};

// Checks a packed batch against a vocabulary: cu_seqlens starts at 0, never decreases, ends at
// T; tokens in [0, V); targets empty or (T) in [-1, V). The message names the field and index.
Status validate_packed_batch(const PackedBatch& batch, int vocab_size, bool need_targets);
// The inverse RoPE frequencies (head_dim/2) of a scaled rope_type (linear, llama3), in fp32 as
// transformers computes them; empty for default RoPE (theta^(-2i/head_dim), built by the backend).
std::vector<float> rope_inv_freq(const ModelConfig& cfg);
// Fills meta (reusing its capacity and device buffer) from a batch already validated: the layout
// with the backend's packed-layout op (host arrays), then cu_seqlens and positions copied to the
// device and the RoPE tables built there. inv_freq: rope_inv_freq() on the device (null = default).
Status build_packed_meta(PackedMeta* meta, const PackedBatch& batch, int head_dim, float rope_theta,
                         const float* inv_freq, const kernels::Backend& backend);
// A decode step's metadata: B rows at host positions pos (one token each, no sequences), their
// positions and RoPE tables on the device.
Status build_decode_meta(PackedMeta* meta, const int32_t* pos, int B, int head_dim, float rope_theta,
                         const float* inv_freq, const kernels::Backend& backend);

// Checks sizes and switches (head counts divide, head_dim even, top-k <= experts, a device with a
// backend, ...).
Status validate_model_config(const ModelConfig& cfg);

// A model that holds one expert-parallel rank's block of experts (Model::slice_experts: the
// learners' memory under policy.moe.expert_parallel): its flat arena is the whole model's with the
// other ranks' routed-expert blocks left out, everything else in the same order. `pieces` walks
// the whole model's arena front to back: runs every rank holds (owner -1) and expert blocks (owner
// q: rank q's block of one layer's gate, up or down experts, the ranks' blocks of a tensor kind
// one after another, q = 0 .. shards-1). `local` is the piece's offset in this model's arena, for
// owner -1 and owner == shard (npos otherwise).
struct ArenaPiece {
  static constexpr size_t npos = static_cast<size_t>(-1);
  size_t whole = 0;
  size_t local = npos;
  size_t size = 0;
  int owner = -1;
};
struct ExpertShardLayout {
  int shard = 0;   // this model's expert-parallel rank: experts [shard E/shards, (shard+1) E/shards)
  int shards = 1;  // E' = policy.moe.expert_parallel
  size_t whole_size = 0;                 // floats of the whole model's arena
  std::vector<ArenaPiece> pieces;        // the whole arena, in order
  std::vector<TensorSpec> whole_table;   // the whole model's tensor table (offsets in its arena)
};

// Where a sharded learner (learner.shard parameters, ZeRO-3) brings each group of weights in and
// lets it go. Groups: kEmbedGroup (the embedding), 0..L-1 (the decoder layers), L (the head: final
// norm and lm_head, the embedding when tied). A training forward then backward calls, in this
// order: need(E), done(E), for l in 0..L-1 need(l), done(l, false); need(L); (the head's forward
// and backward) done(L, true); for l in L-1..0 need(l), done(l, true). need() returns once the
// group's weights are in params(); done(l, true) says layer l's gradient of this micro-batch is
// complete. Other forwards (generation, forward_logits) call nothing.
class ParamHook {
 public:
  static constexpr int kEmbedGroup = -1;
  virtual ~ParamHook() = default;
  virtual Status need(int group) = 0;
  virtual Status done(int group, bool backward) = 0;
};

// The decoder-only transformer (Llama, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE or Mixtral layout). Not
// thread-safe: one caller at a time. Parameters and gradients are one flat fp32 arena each with the same
// table (tensors()); activations are a third arena, grown to the largest batch seen and reused. All of them
// are Buffers of the backend cfg.device selects, and every op runs through that backend.
class Model {
 public:
  // Deterministic init from seed: linear and embedding weights ~ N(0, 0.02), norm weights 1; with
  // cfg.lora.rank > 0 then enable_lora(cfg.lora, seed).
  static Result<Model> create(const ModelConfig& cfg, uint64_t seed = 0);
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const ModelConfig& config() const;
  // Switches batch-invariant mode (ExecutionOptions::batch_invariant) for the calls that follow; the
  // compute dtype resolved at create() stays. A scorer turns it off around forwards of one sequence
  // (a fixed batch, so the default kernels' result depends on that sequence alone) and back on
  // before its decode steps, which share batches.
  void set_batch_invariant(bool on);
  const std::vector<TensorSpec>& tensors() const;       // Hugging Face names, offsets into params()
  const TensorSpec* find_tensor(std::string_view name) const;  // nullptr when absent
  // Parameters and gradients as host spans (fp32, one flat array each in tensors() order). On a
  // host-visible backend (cpu) they are the model's own arrays. On a device backend (cuda,
  // cpu_fenced) they are a host mirror, kept in step with the device: the mutable params() marks
  // the mirror as written, and the next op that reads the weights uploads it first; grads() brings
  // down what backward accumulated on the device (once per backward), and the mutable grads() has
  // the next backward upload what the host wrote. So the optimizer runs on the host over fp32
  // master weights (as ZeRO-Offload's CPU Adam does): one download of the gradients and one upload
  // of the weights per step. A span is valid until the next call into the model; write through it
  // before that call.
  std::span<float> params();
  std::span<const float> params() const;
  // How many times the parameters may have been written: each mutable params() and set_params()
  // counts one. Equal counts at two moments: nothing has written them in between.
  std::uint64_t params_writes() const;
  std::span<float> grads();                                // same layout as params()
  std::span<const float> grads() const;
  // The backend the model runs on.
  const kernels::Backend& backend() const;
  Status set_params(std::span<const float> flat);          // size must equal params().size()
  void zero_grads();
  // The weights' residency hook of training forwards and backwards (ParamHook above; null: none).
  // The hook must outlive its use; it finds the weights in params() (a host-visible model) or in the
  // device arena (device_train_arena(), a sparse one: make_train_arena_sparse).
  void set_param_hook(ParamHook* hook);
  // Expert parallelism (policy.moe.expert_parallel; learner/expert_parallel.h). With an exchange,
  // the training forwards and backwards that follow run each MoE layer's routed experts split over
  // the exchange's ranks (kernels/moe_expert_parallel.h: this rank computes its block of experts for
  // every rank's rows); null (the default): every expert here. Every rank of the group must then
  // run the same forward/backward pairs. Any backend: the layer is its Backend::moe_ep_* (cpu,
  // cpu_fenced; a backend without one fails the first forward naming it), on the backend's own
  // weights and gradients (a device's arenas, synced with the host mirrors as every op's), and the
  // exchange must move the memory that layer hands it (cuda: the backend's join_expert_exchange;
  // cpu, cpu_fenced: a host exchange). A whole model keeps every expert's weights either way, so a
  // forward without the exchange needs no peer.
  Status set_expert_exchange(kernels::MoeExchange* exchange);
  // A forward/backward pair with no tokens of this rank's own, in the order forward_train and
  // backward_train run the MoE layers (checkpointing's recompute included): this rank's experts
  // serve a micro-batch its peers run and it has not; with_backward false: a forward alone (the
  // peers score a batch without training on it). Needs an exchange. With backward and a ParamHook
  // set, the hook's calls of a training forward and backward too, in their order.
  Status expert_parallel_idle_pass(bool with_backward = true);
  // Expert parallelism that divides memory: a copy of this (whole) model holding only expert block
  // `shard` of `shards` of every MoE layer (parameters and gradients of the other blocks are not
  // allocated), every other tensor whole. Its training forwards and backwards need an exchange of
  // `shards` ranks at rank `shard` (set_expert_exchange); every other forward (generation, logits)
  // is refused. Any backend (a device backend's values go through its host mirrors), fp32 base, no
  // LoRA, shards dividing num_experts.
  Result<Model> slice_experts(int shard, int shards) const;
  // create(cfg, seed).slice_experts(shard, shards) without the whole model: the same table, layout
  // and values bit for bit (the block draws the whole model's one init stream in its order and skips
  // over the other blocks' experts), only the block ever allocated. Refused where slice_experts
  // refuses (and with cfg.lora on). The loaders' block (policy::io::load_expert_block) starts here.
  static Result<Model> create_expert_block(const ModelConfig& cfg, uint64_t seed, int shard, int shards);
  // The layout of a model from slice_experts (null for a whole model).
  const ExpertShardLayout* expert_shards() const;

  // LoRA (ModelConfig::lora, policy/README.md "LoRA"). With adapters on, tensors(), params(),
  // grads(), set_params() and all_reduce_grads() are the TRAINABLE adapter arena, named as PEFT
  // saves it (base_model.model.<module>.lora_A.weight (r, in), .lora_B.weight (out, r)), so the
  // optimizer, checkpoints and weight sync carry only the adapters. The frozen base (every
  // Hugging Face tensor of the model) is a second arena without gradients: base_tensors(),
  // base_params(), set_base_params(). Without adapters both name the one arena.
  // Turns adapters on over the current (base) weights: A drawn from mix_seed(seed,
  // seed_stream::lora_init), B = 0, so the model computes what it computed before. Once only.
  Status enable_lora(const LoraConfig& lora, uint64_t seed);
  bool lora_enabled() const;
  // LoRA dropout (lora.dropout > 0; a no-op otherwise): on = true arms it with `seed`, so that the
  // training calls (forward_train, forward_backward_train, backward_train) drop each adapter's
  // input with a mask that is a function of (seed, adapter, element) alone — the backward and its
  // recompute draw the forward's mask again. on = false (the default): no dropout anywhere.
  // Generation, forward_logits and DecodeSlots never drop.
  void set_lora_dropout(bool on, uint64_t seed = 0);
  const std::vector<TensorSpec>& base_tensors() const;
  const TensorSpec* find_base_tensor(std::string_view name) const;
  std::span<const float> base_params() const;              // host span, valid as params()'s
  Status set_base_params(std::span<const float> flat);     // size must equal base_params().size()
  // Adapters served beside the base (inference only; policy/served_adapters.cpp): LoRA adapters of
  // their own rank, scale and modules, each in an arena of its own, applied per sequence by
  // DecodeSlots (SlotSampling::adapter): every projection runs the base GEMM once over all rows of a
  // pass, then each run of rows with the same adapter adds s·(x Aᵀ)Bᵀ with that adapter. A row of
  // adapter a computes what the base with adapter a as its own LoRA (enable_lora) computes. Returns
  // the new adapter's id (1, 2, ...; 0 is the base alone). Errors name the weight at fault.
  Result<int> add_served_adapter(const ServedAdapterWeights& adapter);
  int served_adapters() const;
  // QLoRA (ModelConfig::base_dtype, policy/README.md "QLoRA"): with a quantized base the linear
  // weights q, k, v, o, gate, up, down (dense MLPs, qwen2_moe's gated shared expert) are held as
  // kernels::QuantMatrix blocks the GEMMs dequantize on the fly; their base_tensors() entries are
  // marked `quantized` and take no floats of base_params(). They never get a gradient.
  bool base_quantized() const;
  // A quantized base tensor's blocks (a host copy); an error for a name that is not one.
  Result<kernels::QuantMatrix> base_quant_matrix(std::string_view name) const;
  // A base tensor's fp32 values: from base_params(), or a quantized one's blocks dequantized.
  Result<std::vector<float>> base_tensor_values(const TensorSpec& spec) const;
  // Replaces a quantized base tensor's blocks: the table's shape; with base_dtype gguf any format
  // (the file's), else the configured one. set_base_quant_values quantizes fp32 values (rows x
  // cols) into the configured format (q8_0 under gguf).
  Status set_base_quant(std::string_view name, kernels::QuantMatrix m);
  Status set_base_quant_values(std::string_view name, std::span<const float> values);
  // The trainable arena on the model's device, for an optimizer that steps there
  // (learner/device_optimizer.h): parameters and gradients in the backend's memory, after what the
  // host wrote through params()/grads() has gone up. Empty on a host-visible backend (cpu: params()
  // are the arena) and for a quantized base without adapters (its sampling head follows set_params).
  // The gradients are writable for the sharded learners' collectives (their reduce-scatter sums in
  // place); the host mirror of them is stale from here on.
  struct DeviceArena {
    float* params = nullptr;
    float* grads = nullptr;
    size_t n = 0;
  };
  DeviceArena device_train_arena();
  // The device arena's parameters were written on the device (a device optimizer step): the
  // backend's converted copies follow (weights_written), and the host mirror is brought down by
  // the next params() / base_params() that reads it, not now.
  void device_params_written();
  // Starts bringing that host mirror down now, on the backend's copy queue (pinned memory,
  // Backend::copy_to_host_async) in pieces of piece_floats, ordered after the step and overlapping
  // what runs next (the next forward reads the weights; the next step's writes wait for the
  // copies). Nothing when the mirror is current or the backend is host-visible.
  void refresh_host_mirror(size_t piece_floats = size_t{1} << 22);
  // The trainable weights [0, end) for reading on the host, waiting only for the pieces of the
  // mirror that hold them (the arena itself on a host-visible backend). Unlike params() it does
  // not mark the mirror written (nothing goes up before the next forward). Valid below end until
  // the next call that writes or refreshes the weights.
  const float* host_params_until(size_t end);
  // grads() *= s on the device (Backend::scale: each float(double(g) * s)), what the host wrote
  // through grads() included; nothing comes down.
  void scale_grads(double s);
  // learner.shard parameters on a device (learner/param_shards.h): the trainable weights and
  // gradients become sparse buffers (Backend::alloc_sparse), at first mapped whole with the same
  // values; map_train_arena then maps ([begin, end) in floats, whole granules of
  // Backend::sparse_granularity(), the end may be the arena's) or unmaps the weights' or the
  // gradients' floats. Transfers with the host mirrors (params(), grads(), set_params,
  // refresh_host_mirror) and the ops over the whole arena (zero_grads, scale_grads) then cover the
  // mapped parts only: the caller maps what it reads whole (a gather) and never expects an unmapped
  // part to travel; a forward or backward reads only what is mapped (the hook maps a layer before
  // need() returns). Refused for a host-visible backend, one without sparse buffers, LoRA or a
  // quantized base. After it, weights_written() is no longer called for the arena (the bf16 GEMMs
  // convert their operand each time).
  Status make_train_arena_sparse();
  bool train_arena_sparse() const;
  Status map_train_arena(bool grads, size_t begin, size_t end, bool map);
  // Sums the gradients over the ranks of `c` on the device (NCCL on cuda), what the host wrote
  // through grads() included; the next grads() brings the sum down.
  Status all_reduce_grads(kernels::DeviceCollective& c);

  // Training forward on a packed batch (targets required). Per position t:
  //   logp[t] = log softmax(logits[t] / temperature)[targets[t]]  (0 where targets[t] == -1)
  //   entropy[t] = entropy of that distribution. logp, entropy: (T) caller-owned. temperature > 0.
  // Saves what backward_train needs (until the next forward_* call).
  Status forward_train(const PackedBatch& batch, float temperature, float* logp, float* entropy);
  // Backward of loss = sum_t dlogp[t]*logp[t] + dentropy[t]*entropy[t] (+ the router aux loss when
  // router_aux_loss_coef > 0), ACCUMULATED into grads(). Either pointer may be null (= zeros).
  Status backward_train(const float* dlogp, const float* dentropy);
  // forward_train, then grad(t0, t1) over the rows, then backward_train(dlogp, dentropy), for a loss
  // whose derivative in each position's logp and entropy depends on that position alone: grad
  // reads logp/entropy[t0..t1) (entropy may be null only if grad does not read it) and assigns
  // dlogp[t0..t1) (and dentropy[t0..t1) when dentropy is given; null = no entropy term); all four
  // are caller-owned (T) host arrays. With a chunked head on a host-visible backend the head runs
  // once over tiles of rows (kernels::chunked_logprob_fused: three GEMMs over the vocabulary, not
  // the separate calls' four) and grad is called once per tile, in order; otherwise it is exactly
  // the three calls, grad(0, T) once. Equal to them within 1e-6 relative (bit for bit when V <=
  // policy.logprob_chunk). Consumes the forward: no backward_train may follow.
  Status forward_backward_train(const PackedBatch& batch, float temperature, float* logp, float* entropy,
                                float* dlogp, float* dentropy, const kernels::RowLossGrad& grad);
  // router_aux_loss_coef * sum over MoE layers of the layer's load-balancing loss, last forward.
  float last_aux_loss() const;

  // Logits (T, V) for every position of the batch (targets may be empty). Tests and `troupe score`.
  Status forward_logits(const PackedBatch& batch, float* logits);
  // The final-norm hidden states (rows.size(), hidden_size) of the given positions of the batch
  // (targets may be empty): what a sequence-classification head reads (reward_model.h). Each row
  // in [0, T); out is caller-owned host memory.
  Status forward_hidden(const PackedBatch& batch, std::span<const int32_t> rows, float* out);

  // KV-cache sampling for a batch of prompts of different lengths. logprobs are log
  // softmax(logits / temperature) of the sampled token (before top-k/top-p truncation), i.e. what
  // forward_train at the same temperature returns; greedy (temperature 0) reports temperature 1.
  // Deterministic for a seed; each prompt has its own RNG stream (seed, params.streams[b] or the
  // prompt index b).
  Result<std::vector<Generation>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingParams& params);

  // MoE routing record: routing_width() = (MoE layers) x num_experts_per_tok (0 when dense);
  // last_routing() is (T x routing_width()) of the last forward_train / forward_logits: position t's
  // top-k expert ids of each MoE layer in layer order, ascending within a layer.
  int routing_width() const;
  std::span<const int32_t> last_routing() const;

  // Observability for tests and benchmarks.
  uint64_t packed_meta_builds() const;      // PackedMeta constructions since create()
  size_t activation_peak_bytes() const;     // activation arena + reload buffers (offload store excluded)
  // The CPU offload copy engine and state (offload_activations on the cpu backend; else nullptr: a
  // device backend's offload is its own). Tests and benchmarks
  // set its bandwidth limit / injected delays and read its stats.
  kernels::CopyEngine* offload_engine();
  const kernels::ActivationOffload* activation_offload() const;

  struct Impl;

 private:
  friend class DecodeSlots;  // continuous-batching sampling over the model's layers (decode_slots.h)
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::policy
