// How a model runs, as opposed to what it is: the backend and the three training optimizations.
// A checkpoint's config.json fixes the architecture (ModelArchitecture); these come from the YAML
// (`policy.*`) and apply to fresh and loaded models alike. Every switch is tested against the
// plain path: on or off, log-probs and gradients are bit-identical.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "troupe/base/enum_names.h"

#include "troupe/kernels/backend.h"
#include "troupe/kernels/compute_dtype.h"

namespace troupe::policy {

// MoE routing replay: off, or rollout (train each response token on the experts its sampler chose).
enum class RoutingReplay { off, rollout };

// How the frozen base's linear weights are held (YAML `policy.base_dtype`, QLoRA; policy/README.md
// "QLoRA"): fp32 in the parameter arena, or in quantized blocks (kernels/quant_matrix.h) that the
// GEMMs dequantize on the fly: bf16, q8_0, q4_k quantized from fp32 at load, gguf = the blocks a
// .gguf policy.path stores (its own types, e.g. SmolLM2's Q4_1).
enum class BaseDtype { fp32, bf16, q8_0, q4_k, gguf };

struct ExecutionOptions {
  // Where the model runs (YAML `policy.device`): the backend kernels::backend_for() resolves, cpu,
  // cuda (an error without a usable GPU) or cpu_fenced (the device path on the CPU, for tests).
  kernels::DeviceKind device = kernels::DeviceKind::cpu;
  // May ranks of one node share a GPU (YAML `policy.share_gpu`, kernels/device.h)? Off, more ranks
  // on a node than GPUs is an error when the CUDA backend starts.
  bool share_gpu = false;
  bool cache_packed_metadata = true;      // build packed-sequence metadata once per batch, shared by layers
  bool activation_checkpointing = false;  // recompute each layer in backward from its saved input
  bool offload_activations = false;       // move checkpointed layer inputs to an offload store
  bool offload_double_buffer = true;      // reload layer l-1's input while layer l runs backward
  bool moe_grouped = true;                // counting-sort grouped routing vs the masked loop
  // Vocabulary columns per chunk of the LM head + log-softmax in training (0 = the whole vocabulary
  // at once): no (tokens, vocab) logits buffer. Unlike the switches above this one rounds
  // differently once the vocabulary exceeds a chunk (an online log-sum-exp); a vocabulary of at
  // most one chunk runs the whole-vocabulary ops, bit for bit.
  int logprob_chunk = 4096;
  // Routing replay (YAML `policy.moe.routing_replay: rollout`): a training forward whose batch
  // carries the sampler's expert ids (PackedBatch::experts) routes each recorded token to those
  // experts, with gates from its own router over that set, in forward and backward. MoE only.
  RoutingReplay routing_replay = RoutingReplay::off;
  // Batch-invariant mode (YAML `policy.batch_invariant`, kernels/batch_invariant.h): every op of a
  // forward gives each token bits independent of the other rows of its batch and of KV-cache decode
  // vs packed training forward, and the sampler reports the learner's own log-softmax of the
  // sampled token, so sampler and learner log-probs (and MoE routes) agree exactly. Slower GEMMs.
  bool batch_invariant = false;
  // GEMM precision (YAML `policy.compute_dtype`, kernels/compute_dtype.h): auto (bf16 on a backend
  // with bf16 GEMMs, cuda; fp32 on cpu and cpu_fenced), fp32, or bf16 (GEMM operands rounded to
  // bf16, fp32 accumulation and outputs, fp32 master weights). bf16 needs a backend that supports
  // it (cuda). The model resolves auto when it is made (resolve_compute_dtype).
  kernels::ComputeDtype compute_dtype = kernels::ComputeDtype::auto_;
  // YAML `policy.allow_tf32`: may fp32 GEMMs use TF32 tensor cores (cuda; the CPU ignores it)?
  bool allow_tf32 = true;
  // The frozen base's q/k/v/o/gate/up/down weights in quantized blocks (QLoRA): needs LoRA on or a
  // model used only for sampling/scoring (never trained whole); fp32 = today's single fp32 arena.
  BaseDtype base_dtype = BaseDtype::fp32;
  // YAML `policy.decode_graphs`: on a backend that records graphs (cuda), a dense model's decode
  // step runs as a CUDA graph once its shapes settle (policy/decode_graph.h); the CPU backends
  // ignore it. A failed recording falls back to the ops one by one.
  bool decode_graphs = true;
};

}  // namespace troupe::policy

namespace troupe {
template <>
struct EnumNames<policy::BaseDtype> {
  using B = policy::BaseDtype;
  static constexpr std::pair<std::string_view, B> table[] = {
      {"fp32", B::fp32}, {"bf16", B::bf16}, {"q8_0", B::q8_0}, {"q4_k", B::q4_k}, {"gguf", B::gguf}};
};
}  // namespace troupe
