// `troupe plan`'s model of memory: for every role and rank, the bytes it holds by kind, from the
// config and the model's shape (policy::model_footprint, policy::training_activations), never its
// weights. Invariant: a size here is what the code allocates (named beside each term), not a rule of thumb.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "troupe/actors/weight_encoder.h"
#include "troupe/actors/weight_pieces.h"
#include "troupe/kernels/backend.h"
#include "troupe/launch/plan.h"
#include "troupe/policy/io/gguf.h"
#include "troupe/policy/io/gguf_import.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/memory_footprint.h"

namespace troupe::launch {
namespace {

using actors::ExperimentConfig;
using kernels::DeviceKind;
constexpr uint64_t kF = sizeof(float);

// The architecture: policy.path's config.json or GGUF metadata, else policy.model (a fresh model).
Result<policy::ModelConfig> plan_model_config(const ExperimentConfig& cfg, std::string* source) {
  policy::ModelConfig mc;
  const std::string& path = cfg.policy.path;
  if (path.empty()) {
    static_cast<policy::ModelArchitecture&>(mc) = cfg.policy.model;
    *source = "policy.model (fresh " + enum_string(mc.family) + ")";
  } else if (path.size() > 5 && path.ends_with(".gguf")) {
    TROUPE_ASSIGN_OR_RETURN(auto file, policy::io::GgufFile::open(path));
    TROUPE_ASSIGN_OR_RETURN(auto j, policy::io::gguf_config_json(file));
    TROUPE_ASSIGN_OR_RETURN(mc, policy::io::config_from_hf_json(j, path));
    *source = path + " (GGUF metadata)";
  } else {
    const std::string file = (std::filesystem::path(path) / "config.json").string();
    std::ifstream in(file);
    if (!in) return invalid_input("policy.path: cannot read " + file);
    nlohmann::json j;
    try {
      in >> j;
    } catch (const std::exception& e) {
      return invalid_input(file + ": not valid JSON: " + e.what());
    }
    TROUPE_ASSIGN_OR_RETURN(mc, policy::io::config_from_hf_json(j, file));
    *source = file;
  }
  static_cast<policy::ExecutionOptions&>(mc) = cfg.policy;
  mc.lora = cfg.policy.lora;
  return mc;
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// What every role's sizes depend on: the model, the batch shapes, the device.
struct Shape {
  policy::ModelConfig mc;
  policy::ModelFootprint fp;
  const kernels::Backend* be = nullptr;
  bool host_visible = true;  // cpu: device memory is the host's, touched pages only
  // A device model whose arena learner.shard parameters can make sparse (Model::
  // make_train_arena_sparse: fp32 base, the optimizer on the device) and the granule it maps by.
  bool sparse_arena = false;
  uint64_t granule = 0;
  uint64_t P = 0, A = 0, Tr = 0;  // parameters, adapters, trainable (floats)
  int N = 1;                      // learners
  ShardStage stage = ShardStage::none;
  // distill.teacher or streamed parts (rollout.async_chunks > 1): the trainer's step runs on the
  // whole weights (learner.shard parameters gathers them all for it)
  bool whole_step = false;
  int seq_len = 0, learner_seqs = 0, tokens = 0, batch_seqs = 0;
  uint64_t sync_bytes_per_value = 4;  // weight_sync.dtype
  // compute_dtype bf16: the GEMMs' bf16 copies of their operands (the cuda backend's workspace,
  // grown to the largest GEMM): the largest weight matrix and `rows` rows of the widest input.
  uint64_t bf16_workspace(uint64_t rows) const {
    if (mc.compute_dtype != kernels::ComputeDtype::bf16) return 0;
    const uint64_t C = mc.hidden_size, I = mc.intermediate_size, Q = static_cast<uint64_t>(mc.num_attention_heads) * mc.head_dim;
    const bool chunked = mc.logprob_chunk > 0 && mc.vocab_size > mc.logprob_chunk;
    const uint64_t head = chunked ? mc.logprob_chunk : mc.vocab_size;
    const uint64_t w = std::max({I * C, Q * C, head * C, static_cast<uint64_t>(mc.moe_intermediate_size) * C});
    return 2 * (w + rows * std::max({C, I, Q}));
  }
};

// The learners' reduce-scatter (learner.shard, and none beyond two ranks: the sum in rank order)
// receives every rank's part of its shard in rounds of at most 2^20 values into a scratch; it sends
// from the gradient buffer itself, or, past 2^31 values, through a send buffer of the scratch's size.
uint64_t reduce_scatter_bytes(const Shape& s) {
  if (s.N <= 1 || (s.stage == ShardStage::none && s.N <= 2)) return 0;
  const uint64_t round = std::min<uint64_t>(ceil_div(s.Tr, s.N), uint64_t{1} << 20);
  const uint64_t buffers = s.Tr > static_cast<uint64_t>(INT32_MAX) ? 2 : 1;
  return buffers * static_cast<uint64_t>(s.N) * round * kF;
}

// learner.shard parameters gathers layer by layer (ParamShards; on a device DeviceParamShards over
// a sparse arena) for full-parameter training; LoRA (adapters gathered whole), a device arena that
// cannot be sparse (a quantized base, learner.optimizer_offload), distillation (the whole weights
// gathered for the step) hold whole weights.
bool layered_zero3(const Shape& s) {
  return s.stage == ShardStage::parameters && s.N > 1 && s.A == 0 && (s.host_visible || s.sparse_arena) &&
         !s.whole_step;
}

// policy.moe.expert_parallel with the experts divided (actors::learners_divide_experts at the
// plan's learner count and stage): the routed experts' floats a learner does not hold
// (policy::Model::slice_experts: every MoE layer's gate, up and down blocks of the other E - 1
// ranks); 0 when every learner holds every expert.
uint64_t experts_not_held(const ExperimentConfig& cfg, const Shape& s) {
  const int E = cfg.policy.expert_parallel;
  if (E <= 1 || s.stage != ShardStage::none || s.N <= 1 || cfg.rollout.async || s.A > 0) return 0;
  uint64_t layers = 0;
  for (int l = 0; l < s.mc.num_hidden_layers; ++l) layers += s.mc.is_moe_layer(l) ? 1 : 0;
  const uint64_t routed = layers * 3 * static_cast<uint64_t>(s.mc.num_experts) * s.mc.moe_intermediate_size *
                          static_cast<uint64_t>(s.mc.hidden_size);
  return routed - routed / static_cast<uint64_t>(E);
}

// Weight sync from the shards (actors::weights_from_shards at the plan's learner count and stage):
// every learner encodes its own shard (divided experts: the first group's learners their runs,
// actors/expert_sync.h) and sends it to the generators (actors/weight_pieces.h).
bool sync_from_shards(const ExperimentConfig& cfg, const Shape& s) {
  return (s.stage != ShardStage::none || experts_not_held(cfg, s) > 0) && s.N > 1 &&
         cfg.weight_sync.transport == actors::WeightTransport::zmq;
}

// Whether a learner's step runs more than one micro-batch (then backward accumulates every layer's
// gradient whole before the last micro-batch's per-layer reduce-scatter).
bool several_micro_batches(const Shape& s) {
  return static_cast<int64_t>(s.tokens) < static_cast<int64_t>(s.learner_seqs) * s.seq_len;
}

// policy.moe.expert_parallel (learner/README.md "Expert parallelism"): each MoE layer keeps what its expert-parallel exchange received
// (kernels::MoeEpState: the rows' inputs (C) and gate/up pre-activations (2H), an exchange buffer
// (C + 1), expert scratch (2H)) and the rank's own rows packed for the backward (C + 1): at an even
// load a rank computes as many rows as its tokens route (tokens x K).
uint64_t expert_parallel_bytes(const ExperimentConfig& cfg, const Shape& s) {
  if (cfg.policy.expert_parallel <= 1) return 0;
  uint64_t layers = 0;
  for (int l = 0; l < s.mc.num_hidden_layers; ++l) layers += s.mc.is_moe_layer(l) ? 1 : 0;
  const uint64_t C = s.mc.hidden_size, H = s.mc.moe_intermediate_size;
  const uint64_t rows = static_cast<uint64_t>(s.tokens) * s.mc.num_experts_per_tok;
  return layers * rows * (C + 2 * H + (C + 1) + 2 * H + (C + 1)) * kF;
}

void learner_weights_and_state(const ExperimentConfig& cfg, const Shape& s, PlanRow& r) {
  const uint64_t o_div = s.stage != ShardStage::none ? s.N : 1;
  // Model::Impl::alloc_params: the parameter arena; enable_lora: the adapter arena beside it.
  r.weights = s.P * kF + s.A * kF;
  // The trainable arena's gradients (the base's are freed under LoRA; an MoE layer's frozen
  // router/expert gradients go to a one-layer sink). learner.shard gradients reduce-scatters them,
  // but backward still fills the model's whole gradient arena on every rank.
  r.gradients = s.Tr * kF + s.fp.moe_sink_floats * kF;
  uint64_t in_flight = 0;  // ZeRO-3: the receive scratch of the layer reduce-scatter in flight
  if (layered_zero3(s)) {
    // The shard, and one group gathered at a time (a decoder layer, or the embedding / the head).
    // troupe run: every learner does in async runs (stale samples are scored with old weights);
    // else learner 0 holds the whole weights between steps when it alone syncs them. When the
    // shards sync them, the probe's forward gathers layer by layer too (Trainer::forward_from_shards).
    // (untied: the embedding and the head, norm included, are gathered apart, about half each)
    const uint64_t head = s.mc.tie_word_embeddings ? s.fp.outer_floats : (s.fp.outer_floats + s.mc.hidden_size) / 2;
    // With the prefetch (ParamShards::set_prefetch, on) the next group's gather runs while one
    // computes: two groups whole at once (two layers, or the last layer and the head). Their
    // non-owned pages are a pool reused from group to group (learner/page_pool.h), resident once
    // made, of at most this size; so is the gradients' pool below (the head's and two layers').
    // On a device the collectives block (no prefetch): one group at a time, and each group's two
    // edge granules (shared with a neighbour or the shard) stay mapped in both arenas.
    const uint64_t groups = s.host_visible ? 2 : 1;
    const uint64_t gathered = s.host_visible ? std::max(2 * s.fp.largest_layer_floats, s.fp.largest_layer_floats + head)
                                             : std::max(s.fp.largest_layer_floats, head);
    const uint64_t edges = s.host_visible ? 0 : (static_cast<uint64_t>(s.mc.num_hidden_layers) + 3) * s.granule;
    const bool whole = r.index == 0 && !sync_from_shards(cfg, s);
    if (!whole && !cfg.rollout.async) r.weights = ceil_div(s.P, s.N) * kF + gathered * kF + edges;
    // The shard; the embedding's gradient whole until the step's end; the head's (untied) until
    // its reduce-scatter right after its backward, before any layer's; two layers' gradients
    // before their reduce-scatters (one in flight while the next runs its backward; one on a
    // device) and the one in flight's receive scratch (ranks x its shard: about a layer; none on a
    // device, whose collective sums in place); with one micro-batch, several accumulate them whole.
    const uint64_t embedding = s.mc.tie_word_embeddings ? s.fp.outer_floats : s.fp.outer_floats - head;
    if (!several_micro_batches(s))
      r.gradients = (ceil_div(s.P, s.N) +
                     std::max(s.fp.outer_floats, embedding + groups * s.fp.largest_layer_floats)) * kF + edges;
    in_flight = s.host_visible ? s.fp.largest_layer_floats * kF : 0;
  }
  r.optimizer = ceil_div(2 * s.Tr * kF, o_div);  // AdamW m_, v_ (fp32) of this rank's shard
  if (const uint64_t away = experts_not_held(cfg, s)) {
    // This learner's block of experts: weights, gradients and moments without the others' (learner
    // 0 too: the weight sync goes from the blocks, and each learner writes its part of a checkpoint).
    r.weights = (s.P - away) * kF;
    r.gradients = (s.Tr - away) * kF;
    r.optimizer = 2 * (s.Tr - away) * kF;
  }
  r.collectives = reduce_scatter_bytes(s) + in_flight + expert_parallel_bytes(cfg, s);
  if (cfg.loss.kl_coef > 0) {  // the frozen reference policy: a second model (LearnerRole::create)
    // (with the experts divided, on every learner only its block: make_policy's expert block)
    r.weights += (s.P - experts_not_held(cfg, s)) * kF + s.A * kF;
    if (!s.host_visible) r.gradients += (s.A > 0 ? s.A : s.P) * kF;  // allocated on the device, never used
    r.notes.push_back("loss.kl_coef > 0: a reference model (weights, and its activations per 4096 tokens)");
  }
}

Status learner_activations(const ExperimentConfig& cfg, const Shape& s, PlanRow& r, uint64_t* host_store) {
  TROUPE_ASSIGN_OR_RETURN(auto acts, policy::training_activations(s.mc, *s.be, s.tokens, s.seq_len));
  r.activations = (acts.arena_floats + acts.reload_floats) * kF + s.bf16_workspace(s.tokens);
  *host_store = acts.store_floats * kF;
  const int logprob_tokens = std::min(s.learner_seqs * s.seq_len, std::max(4096, s.seq_len));
  if (cfg.loss.kl_coef > 0) {  // compute_completion_logprobs on the reference model
    TROUPE_ASSIGN_OR_RETURN(auto ref, policy::training_activations(s.mc, *s.be, logprob_tokens, s.seq_len));
    r.activations += ref.arena_floats * kF;
  }
  if (logprob_tokens > s.tokens && (cfg.grpo.num_iterations > 1 || cfg.rollout.async)) {
    // old log-probs / mismatch scoring in 4096-token forwards grow the same arena
    TROUPE_ASSIGN_OR_RETURN(auto old, policy::training_activations(s.mc, *s.be, logprob_tokens, s.seq_len));
    r.activations = std::max(r.activations, old.arena_floats * kF);
  }
  // The batch every learner receives (tokens, log-probs, masks) and the packed micro-batch arrays.
  r.other = static_cast<uint64_t>(s.batch_seqs) * s.seq_len * 16 + static_cast<uint64_t>(s.tokens) * 64;
  return {};
}

void learner_sync(const ExperimentConfig& cfg, const Shape& s, PlanRow& r, uint64_t* host_sync) {
  const auto& ws = cfg.weight_sync;
  uint64_t h = 0;
  if (cfg.rollout.async)  // LearnerRole::snapshots_: the versions a stale sample may be scored with
    h += static_cast<uint64_t>(cfg.rollout.max_staleness + 1) * s.Tr * kF;
  const uint64_t away = experts_not_held(cfg, s);
  if (sync_from_shards(cfg, s)) {
    // Every learner's WeightEncoder over its shard in lean memory: what the generators hold of it,
    // which a full piece is sent from; a delta's frames and payload, abandoned for a full piece past
    // 1/kLeanDeltaShare of it; and the runs of the piece in flight to each of the root's children.
    // Divided experts: the first group's learners encode 1/E of the values each (their experts and
    // 1/E of the rest), the others nothing.
    const int E = cfg.policy.expert_parallel;
    const uint64_t share = away == 0 ? ceil_div(s.Tr, s.N) : r.index < E ? ceil_div(s.Tr, static_cast<uint64_t>(E)) : 0;
    const uint64_t held = share * s.sync_bytes_per_value;
    h += held + 2 * ceil_div(held, actors::WeightEncoder::kLeanDeltaShare);
    const int G = cfg.cluster.generators, fan = ws.relay_fanout;
    const uint64_t children = static_cast<uint64_t>(fan >= 2 && G > fan ? fan : G);
    h += children * actors::kPieceWindow * actors::kPieceRunBytes;
    // The probe: ZeRO-3 runs it from the shards (no more than a step gathers); else learner 0
    // gathers the whole weights for it (in "weights"), and in bf16 backs up its master.
    // Divided experts: every learner runs it with its group, its own arena backed up in bf16.
    if (ws.dtype == actors::WeightDtype::bf16 && ws.probe && away > 0)
      h += (s.Tr - away) * kF;
    else if (r.index == 0 && ws.dtype == actors::WeightDtype::bf16 && ws.probe && !layered_zero3(s))
      h += s.Tr * kF;
  } else if (r.index == 0) {
    // WeightEncoder: what the generators hold (held16_/held32_) and one encoded full payload.
    h += 2 * s.Tr * s.sync_bytes_per_value;
    if (ws.dtype == actors::WeightDtype::bf16 && ws.probe) h += s.Tr * kF;  // master_backup_
    if (ws.transport == actors::WeightTransport::nccl) r.collectives += s.Tr * s.sync_bytes_per_value;
  }
  *host_sync = h;
}

Result<PlanRow> learner_row(const ExperimentConfig& cfg, const Shape& s, int index) {
  PlanRow r;
  r.role = "learner";
  r.index = index;
  r.rank = index;
  learner_weights_and_state(cfg, s, r);
  uint64_t store = 0, sync = 0;
  TROUPE_TRY(learner_activations(cfg, s, r, &store));
  learner_sync(cfg, s, r, &sync);
  r.sync = sync;
  if (s.host_visible) {
    r.activations += store;
    r.device = r.weights + r.gradients + r.optimizer + r.activations + r.sync + r.collectives + r.other;
  } else {
    // Device: weights, gradients, activations, collectives, and AdamW's moments (a sharded
    // learner's shard of them) where the optimizer steps on the device (learner/README.md
    // "Optimizer": not learner.optimizer_offload, not divided experts, not a quantized base without
    // adapters). Host: the mirror of the weights and gradients (Model::params()/grads()), AdamW
    // otherwise (its host mirror is allocated either way), the offload store, sync buffers, the batch.
    const bool divided = cfg.policy.expert_parallel > 1 && experts_not_held(cfg, s) > 0;
    const bool quant_whole = cfg.policy.base_dtype != policy::BaseDtype::fp32 && s.A == 0;
    const bool opt_on_device = !cfg.learner.optimizer_offload && !divided && !quant_whole;
    r.device = r.weights + r.gradients + r.activations + r.collectives + (opt_on_device ? r.optimizer : 0);
    // (a sparse arena's mirrors stay whole: the shard's parts of them travel, the rest waits unused)
    const uint64_t mirrors = layered_zero3(s) ? (s.P + s.Tr) * kF : r.weights + r.gradients;
    r.host = mirrors + r.optimizer + store + r.sync + r.other;
    if (opt_on_device) r.notes.push_back("AdamW on the device (its moments also mirrored in host memory)");
    if (store > 0) r.notes.push_back("offload store " + format_bytes(store) + " in host memory");
  }
  if (index == 0) r.notes.push_back("hosts the coordinator (its row below)");
  return r;
}

// A generator's KV cache: every sample of its GenerateReq (its share of a step's groups, or one env's
// eval.num_prompts) in a slot of max_prompt + max_response.
void generator_kv(const ExperimentConfig& cfg, const Shape& s, MemoryPlan& plan) {
  const auto& ro = cfg.rollout;
  const int G = cfg.cluster.generators;
  const int train_slots = static_cast<int>(ceil_div(ro.prompts_per_step, G)) * ro.num_generations;
  const int eval_slots = cfg.eval.num_prompts;  // an env's held-out prompts, in one greedy request
  plan.kv_slots = cfg.grpo.enabled ? std::max(train_slots, eval_slots) : eval_slots;
  plan.kv_context = std::min(ro.max_prompt_length + ro.max_response_length, s.mc.max_position_embeddings);
}

Result<PlanRow> generator_row(const ExperimentConfig& cfg, const Shape& s, const MemoryPlan& plan, int index) {
  PlanRow r;
  r.role = "generator";
  r.index = index;
  r.rank = s.N + index;
  const auto& ro = cfg.rollout;
  int copies = 1;
  if (ro.async && ro.in_flight_updates) ++copies, r.notes.push_back("in-flight updates: a staging copy");
  if (!ro.serve.empty()) ++copies, r.notes.push_back("rollout.serve: a serving copy and its KV cache");
  r.weights = copies * (s.P + s.A) * kF;
  // alloc_params also makes a gradient arena: never touched on cpu (calloc), real memory elsewhere.
  if (!s.host_visible) r.gradients = copies * (s.A > 0 ? s.A : s.P) * kF;
  const uint64_t slots = plan.kv_slots, ctx = plan.kv_context;
  r.kv_cache = slots * ctx * s.fp.kv_floats_per_token * kF;
  if (!ro.serve.empty())
    r.kv_cache += static_cast<uint64_t>(ro.serve_slots) * std::min(s.mc.max_position_embeddings, 4096) *
                  s.fp.kv_floats_per_token * kF;
  const int prefill = static_cast<int>(slots) * ro.max_prompt_length;
  TROUPE_ASSIGN_OR_RETURN(uint64_t arena, policy::inference_arena_floats(s.mc, *s.be, prefill, ro.max_prompt_length));
  const bool chunked = s.mc.logprob_chunk > 0 && s.mc.vocab_size > s.mc.logprob_chunk;
  const uint64_t logits = slots * static_cast<uint64_t>(chunked ? s.mc.logprob_chunk : s.mc.vocab_size);
  r.activations = (arena + logits) * kF + s.bf16_workspace(static_cast<uint64_t>(prefill));
  // The Weights message received (a full sync), and async's versions held back until asked.
  uint64_t sync = s.Tr * s.sync_bytes_per_value;
  if (ro.async) sync += static_cast<uint64_t>(ro.max_staleness) * s.Tr * kF;
  r.sync = sync;
  if (cfg.weight_sync.transport == actors::WeightTransport::nccl) r.collectives = s.Tr * s.sync_bytes_per_value;
  if (s.host_visible) {
    r.device = r.weights + r.gradients + r.kv_cache + r.activations + r.sync + r.collectives;
  } else {
    r.device = r.weights + r.gradients + r.kv_cache + r.activations + r.collectives;
    r.host = r.weights + r.gradients + r.sync;  // the host mirror of params/grads, the message
  }
  return r;
}

void other_rows(const ExperimentConfig& cfg, const Shape& s, MemoryPlan& plan) {
  PlanRow c;
  c.role = "coordinator";
  c.rank = 0;
  // A step's samples (tokens, log-probs, masks, versions) and its trajectories.
  c.other = static_cast<uint64_t>(s.batch_seqs) * s.seq_len * 24;
  c.device = s.host_visible ? c.other + c.sync : 0;
  c.host = s.host_visible ? 0 : c.other + c.sync;
  c.notes.push_back("on rank 0, beside learner 0");
  if (sync_from_shards(cfg, s))  // (the pieces' heads alone: checksums, chunk tables, the probe)
    c.notes.push_back("joins the pieces' heads; the learners send the weights to the generators themselves");
  plan.rows.push_back(c);
  for (int i = 0; i < cfg.cluster.env_workers; ++i) {
    PlanRow e;
    e.role = "env_worker";
    e.index = i;
    e.rank = s.N + cfg.cluster.generators + i;
    e.notes.push_back("the envs' own memory is not planned");
    plan.rows.push_back(e);
  }
}

Result<Shape> plan_shape(const ExperimentConfig& cfg, const PlanOptions& o, MemoryPlan& plan) {
  Shape s;
  TROUPE_ASSIGN_OR_RETURN(s.mc, plan_model_config(cfg, &plan.model));
  TROUPE_ASSIGN_OR_RETURN(s.fp, policy::model_footprint(s.mc));
  s.host_visible = cfg.policy.device == DeviceKind::cpu;
  s.sparse_arena = !s.host_visible && !cfg.learner.optimizer_offload && cfg.policy.base_dtype == policy::BaseDtype::fp32;
  // (cuda: the driver's recommended granule of current GPUs, 2 MiB; cpu_fenced: a page)
  s.granule = cfg.policy.device == DeviceKind::cpu_fenced ? static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : uint64_t{2} << 20;
  if (cfg.policy.device == DeviceKind::cpu_fenced) {
    TROUPE_ASSIGN_OR_RETURN(s.be, kernels::backend_for(DeviceKind::cpu_fenced));
  } else {
    s.be = &kernels::cpu_backend();  // cuda: the CPU layout of the scratch (no GPU is started)
    if (cfg.policy.device == DeviceKind::cuda)
      plan.notes.push_back("cuda: activation scratch sized as the cpu backend lays it out (the MoE kernel's differs slightly)");
    if (cfg.policy.compute_dtype == kernels::ComputeDtype::bf16)
      plan.notes.push_back("compute_dtype bf16: weights, gradients and activations stay fp32; activations include the "
                           "GEMMs' bf16 operand copies");
  }
  s.P = s.fp.param_floats;
  s.A = s.fp.lora_floats;
  s.Tr = s.A > 0 ? s.A : s.P;
  s.N = o.learners > 0 ? o.learners : cfg.cluster.learners;
  s.stage = o.shard ? *o.shard : cfg.learner.shard;
  s.whole_step = cfg.distill.enabled() || cfg.rollout.async_chunks > 1;
  if (s.stage == ShardStage::gradients)
    plan.notes.push_back("shard gradients: each learner sums only its shard, but backward still fills the model's "
                         "whole gradient arena, so the gradients column is not divided");

  const auto& ro = cfg.rollout;
  s.seq_len = ro.max_prompt_length + ro.max_response_length * ro.max_turns;
  s.seq_len = std::min(s.seq_len, s.mc.max_position_embeddings);
  if (ro.max_turns > 1) plan.notes.push_back("multi-turn: the env's answers inside an episode are not counted in its length");
  const int grpo_seqs = cfg.grpo.enabled ? ro.prompts_per_step * ro.num_generations : 0;
  s.batch_seqs = std::max(grpo_seqs, cfg.sft.enabled ? cfg.sft.batch_size : 0);
  s.learner_seqs = static_cast<int>(ceil_div(s.batch_seqs, s.N));
  int64_t tokens = static_cast<int64_t>(s.learner_seqs) * s.seq_len;
  if (cfg.grpo.micro_batch_tokens > 0) tokens = std::min<int64_t>(tokens, std::max(cfg.grpo.micro_batch_tokens, s.seq_len));
  s.tokens = static_cast<int>(std::max<int64_t>(tokens, s.seq_len));
  if (s.stage == ShardStage::parameters && s.N > 1) {
    if (!layered_zero3(s))
      plan.notes.push_back(std::string("shard parameters: ") +
                           (s.A > 0            ? "LoRA adapters are gathered whole for a step"
                            : !s.host_visible && !s.sparse_arena
                                ? "on a device with a quantized base or learner.optimizer_offload the weights stay whole"
                            : cfg.distill.enabled() ? "distillation gathers the whole weights for a step"
                                                    : "streamed parts (rollout.async_chunks > 1) gather the whole "
                                                      "weights for a step") +
                           ", so only the AdamW moments are divided");
    else
      plan.notes.push_back(std::string("shard parameters: each learner keeps its shard and gathers one layer (or the "
                                       "embedding, or the head) at a time, ") +
                           (s.host_visible ? "the next one's gather in flight; "
                                           : "into a sparse device arena (mapped per layer, the gathers blocking); ") +
                           (sync_from_shards(cfg, s)
                                ? std::string("each encodes its shard for the weight sync and sends it to the "
                                              "generators") +
                                      (cfg.weight_sync.probe ? ", and runs the probe layer by layer too" : "")
                                : std::string("learner 0 keeps the whole weights between steps for the weight sync")) +
                           (cfg.rollout.async ? ", and in async runs every learner does" : "") +
                           (several_micro_batches(s) ? "; several micro-batches a step accumulate whole gradients" : ""));
  }
  if (const int E = cfg.policy.expert_parallel; E > 1 && experts_not_held(cfg, s) > 0)
    plan.notes.push_back("policy.moe.expert_parallel " + std::to_string(E) + ": each learner holds num_experts / " +
                         std::to_string(E) + " experts per MoE layer (weights, gradients, AdamW moments: " +
                         std::to_string(experts_not_held(cfg, s)) +
                         " routed-expert floats fewer than the whole model), learner 0 too: the first " +
                         std::to_string(E) + " learners send the generators their experts and 1/" + std::to_string(E) +
                         " of the rest each, and write them in a checkpoint; the collectives column adds each MoE "
                         "layer's exchanged rows at an even load");
  else if (E > 1)
    plan.notes.push_back("policy.moe.expert_parallel " + std::to_string(E) + ": each learner computes num_experts / " +
                         std::to_string(E) + " experts per MoE layer but keeps every expert's weights, gradients and "
                         "AdamW moments (not divided: learner.shard other than none, or rollout.async" +
                         (layered_zero3(s) ? std::string("; shard parameters: in its shard, each layer gathered with "
                                                         "every expert")
                                           : std::string()) +
                         "); the collectives column adds each MoE layer's exchanged rows at an even load");
  s.sync_bytes_per_value = cfg.weight_sync.dtype == actors::WeightDtype::bf16 ? 2 : 4;
  return s;
}

}  // namespace

Result<MemoryPlan> plan_memory(const ExperimentConfig& cfg, const std::string& config_file, const PlanOptions& o) {
  MemoryPlan plan;
  plan.config_file = config_file;
  plan.device = enum_string(cfg.policy.device);
  plan.compute_dtype = enum_string(cfg.policy.compute_dtype);
  TROUPE_ASSIGN_OR_RETURN(Shape s, plan_shape(cfg, o, plan));
  plan.params = s.P;
  plan.trainable = s.Tr;
  plan.shard = s.stage;
  plan.learners = s.N;
  plan.train_tokens = s.tokens;
  plan.train_sequences = s.learner_seqs;
  generator_kv(cfg, s, plan);
  for (int i = 0; i < s.N; ++i) {
    TROUPE_ASSIGN_OR_RETURN(PlanRow r, learner_row(cfg, s, i));
    plan.rows.push_back(std::move(r));
  }
  for (int i = 0; i < cfg.cluster.generators; ++i) {
    TROUPE_ASSIGN_OR_RETURN(PlanRow r, generator_row(cfg, s, plan, i));
    plan.rows.push_back(std::move(r));
  }
  other_rows(cfg, s, plan);
  if (!cfg.learner.memory_budget.empty()) {
    TROUPE_ASSIGN_OR_RETURN(uint64_t b, parse_byte_size(cfg.learner.memory_budget, "learner.memory_budget"));
    plan.capacity = b;
    plan.capacity_from = "learner.memory_budget " + format_bytes(b);
  }
  if (o.device_memory && (!plan.capacity || *o.device_memory < *plan.capacity)) {
    plan.capacity = *o.device_memory;
    plan.capacity_from = "--device-memory " + format_bytes(*o.device_memory);
  }
  return plan;
}

}  // namespace troupe::launch
