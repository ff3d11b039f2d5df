// The experiment schema: every YAML key, in README order, with its range and meaning. Each key
// writes its C++ field directly (same name: ExperimentConfig's sections, policy::ModelConfig and
// learner's AdvantageConfig, GrpoLossConfig and OptimizerConfig); enum keys list their YAML names.
// Defaults come from the field initializers (read off a default-constructed config). Adding a
// field = one line here; the loader, --set, the resolved config and the README follow.
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

#include "troupe/launch/config.h"

namespace troupe::launch {
namespace {

using actors::EnvSpec;
using actors::ExperimentConfig;
using learner::AdvantageEstimator;
using learner::KlEstimator;
using learner::LossAggMode;
using learner::LrSchedule;
using learner::StdMode;

constexpr double kIntMax = 2147483647.0;

template <class Root>
struct Builder {
  std::vector<KeySpec<Root>> keys;

  template <class F>
  void flag(std::string path, F f, std::string desc) {
    keys.push_back({std::move(path), KeyType::boolean, std::nullopt, std::nullopt, {}, std::move(desc),
                    [f](Root& r) -> FieldRef { return f(r); }});
  }
  template <class F>
  void integer(std::string path, F f, double lo, double hi, std::string desc) {
    keys.push_back({std::move(path), KeyType::integer, lo, hi, {}, std::move(desc),
                    [f](Root& r) -> FieldRef { return f(r); }});
  }
  template <class F>
  void number(std::string path, F f, double lo, double hi, std::string desc) {
    keys.push_back({std::move(path), KeyType::number, lo, hi, {}, std::move(desc),
                    [f](Root& r) -> FieldRef { return f(r); }});
  }
  template <class F>
  void text(std::string path, F f, std::string desc) {
    keys.push_back({std::move(path), KeyType::string, std::nullopt, std::nullopt, {}, std::move(desc),
                    [f](Root& r) -> FieldRef { return f(r); }});
  }
  // An enum field: its YAML names in `names`, which are also the key's choices.
  template <class F, class E = std::remove_pointer_t<std::invoke_result_t<F, Root&>>>
  void enumeration(std::string path, F f, std::vector<std::pair<std::string, E>> names, std::string desc) {
    std::vector<std::string> choices;
    for (const auto& n : names) choices.push_back(n.first);
    keys.push_back({std::move(path), KeyType::string, std::nullopt, std::nullopt, std::move(choices), std::move(desc),
                    [f, names](Root& r) -> FieldRef {
                      E* p = f(r);
                      EnumRef ref;
                      for (const auto& [name, value] : names)
                        if (value == *p) ref.name = name;
                      ref.set = [p, names](const std::string& s) {
                        for (const auto& [name, value] : names)
                          if (name == s) *p = value;
                      };
                      return ref;
                    }});
  }
  // An enum field whose YAML names are declared beside the enum (troupe/base/enum_names.h).
  template <class F, class E = std::remove_pointer_t<std::invoke_result_t<F, Root&>>>
    requires has_enum_names<E>
  void enumeration(std::string path, F f, std::string desc) {
    std::vector<std::pair<std::string, E>> names;
    for (const auto& [name, value] : EnumNames<E>::table) names.emplace_back(std::string(name), value);
    enumeration(std::move(path), f, std::move(names), std::move(desc));
  }
  // A list of enum values (names beside the enum, troupe/base/enum_names.h); one name alone in
  // the YAML is a one-element list.
  template <class F, class E = typename std::remove_pointer_t<std::invoke_result_t<F, Root&>>::value_type>
    requires has_enum_names<E>
  void enum_list(std::string path, F f, std::string desc) {
    std::vector<std::string> choices;
    for (const auto& [name, value] : EnumNames<E>::table) choices.emplace_back(name);
    keys.push_back({std::move(path), KeyType::string_list, std::nullopt, std::nullopt, std::move(choices),
                    std::move(desc), [f](Root& r) -> FieldRef {
                      auto* p = f(r);
                      EnumListRef ref;
                      for (E v : *p) ref.names.push_back(enum_string(v));
                      ref.set = [p](const std::vector<std::string>& names) {
                        p->clear();
                        for (const auto& n : names)
                          for (const auto& [name, value] : EnumNames<E>::table)
                            if (name == n) p->push_back(value);
                      };
                      return ref;
                    }});
  }
  template <class F>
  void int_list(std::string path, F f, double lo, double hi, std::string desc) {
    keys.push_back({std::move(path), KeyType::int_list, lo, hi, {}, std::move(desc),
                    [f](Root& r) -> FieldRef { return f(r); }});
  }
  template <class F>
  void string_list(std::string path, F f, std::string desc) {
    keys.push_back({std::move(path), KeyType::string_list, std::nullopt, std::nullopt, {}, std::move(desc),
                    [f](Root& r) -> FieldRef { return f(r); }});
  }
  template <class F>
  void mapping(std::string path, F f, std::string desc) {
    keys.push_back({std::move(path), KeyType::mapping, std::nullopt, std::nullopt, {}, std::move(desc),
                    [f](Root& r) -> FieldRef { return f(r); }});
  }
};

// run, policy.
void add_run_and_policy_keys(Builder<ExperimentConfig>& b) {
  using C = ExperimentConfig;
  // run
  b.text("run.dir", [](C& c) { return &c.run.dir; }, "Run directory: config.resolved.yaml, metrics.jsonl, tb/, trajectories/, checkpoints/, logs/ (the output of the processes troupe starts: env servers, the W&B process), wandb/ (logger.wandb) (a leading ~/ is $HOME).");
  b.text("run.name", [](C& c) { return &c.run.name; }, "Name shown in the progress display and TensorBoard.");
  b.integer("run.seed", [](C& c) { return &c.run.seed; }, 0, kIntMax, "Seed of every random stream (init, prompts, sampling); fixed seed + CPU + sync = bit-identical metrics.");
  b.number("run.max_wall_s", [](C& c) { return &c.run.max_wall_s; }, 0, 1e7, "Stop the run (after a checkpoint) once this many seconds passed; 0 = no limit.");
  b.integer("run.restarts", [](C& c) { return &c.run.restarts; }, 0, 1000, "troupe run becomes a supervisor outside mpirun/srun that starts the job and, when it fails (a rank or the coordinator's process dies, any exit but 0 and 2), starts it again from its latest complete checkpoint with --resume, at most this many times; each restart is logged with its cause (stderr and run.dir/logs/restarts.log). 0 = no supervisor. The --restarts flag overrides it.");
  b.flag("run.restart_remaining_ranks", [](C& c) { return &c.run.restart_remaining_ranks; }, "With run.restarts and run.launcher: a restart leaves out the roles of the ranks the launcher reported dead by a signal (Open MPI's mpirun, Slurm's srun; read from its stderr, which the supervisor passes on): cluster.learners, generators, env_workers or scorers one less per lost rank (each kind keeps at least one; the last of a kind is started again in its place), and run.launcher's {np} is the new world size (the launcher must contain {np}, e.g. \"mpirun -np {np}\"). Checkpoints load at any learner count (sharded ones reshard), so the run goes on from the latest one; the sums run in another order, so the steps after it are exactly-once, not bit-identical. false = the same ranks every time.");
  b.text("run.launcher", [](C& c) { return &c.run.launcher; }, "With run.restarts: the command that starts the job's ranks, the troupe run command appended, e.g. \"mpirun -np 4\" or \"srun --mpi=pmix -n 4\" (empty = one process); {np} in it is replaced by the world size (one rank per role of the cluster section). The --launcher flag overrides it.");

  // policy
  b.text("policy.path", [](C& c) { return &c.policy.path; }, "Start from this model directory (ours or transformers-made) or a .gguf file (imported once into $TROUPE_CACHE/gguf, default ~/.cache/troupe); a leading ~/ is $HOME. Its config.json fixes the architecture, so policy.model keys are an error with it. Empty = fresh initialization from policy.model.");
  b.enumeration("policy.tokenizer", [](C& c) { return &c.policy.tokenizer; }, "Tokenizer: char (printable ASCII, for built-in tasks), byte, or auto (the model directory's tokenizer).");
  b.number("policy.init_std", [](C& c) { return &c.policy.init_std; }, 0, 1, "Standard deviation of the fresh initialization.");
  b.enumeration("policy.device", [](C& c) { return &c.policy.device; }, "Backend the model runs on: cpu (OpenMP + BLAS), cuda (one NVIDIA GPU: cuBLAS and the kernels of kernels/cuda/), or cpu_fenced (the CPU ops behind device memory the host cannot touch: runs the device path cuda takes -- host mirror of the weights, every host array copied to the device -- on a machine without a GPU, with the cpu backend's numbers; for tests). cuda is an error when the build has no CUDA (troupe validate checks that, and never starts a GPU) and, when the model starts, when the process sees no GPU.");
  b.flag("policy.share_gpu", [](C& c) { return &c.policy.share_gpu; }, "With policy.device: cuda, may ranks of one node (learners, GPU generators) share a GPU? false: each rank gets its own (TROUPE_CUDA_DEVICE, else the node-local rank), and a node with more ranks than visible GPUs is an error naming both when the model starts. true: rank r runs on GPU r modulo the count, several to a GPU.");
  b.enumeration("policy.compute_dtype", [](C& c) { return &c.policy.compute_dtype; }, "GEMM precision: auto (bf16 on policy.device: cuda, fp32 on cpu and cpu_fenced, so CPU numbers never change), fp32, or bf16 (every GEMM reads its operands rounded to bf16 and accumulates in fp32 into fp32 outputs, on tensor cores; the weights' bf16 copies are made once per write of the weights, i.e. once per optimizer step, not per GEMM; master weights, activations, gradients and every other op stay fp32). bf16 needs policy.device: cuda and is an error with policy.batch_invariant.");
  b.flag("policy.allow_tf32", [](C& c) { return &c.policy.allow_tf32; }, "May fp32 GEMMs on policy.device: cuda use TF32 tensor cores (cuBLAS TF32 math mode: inputs rounded to a 10-bit mantissa, fp32 accumulation)? Matters where the GEMMs run in fp32 (policy.compute_dtype: fp32); false gives true fp32 GEMMs. The CPU backends ignore it.");
  b.enumeration("policy.base_dtype", [](C& c) { return &c.policy.base_dtype; }, "QLoRA: how the frozen base holds its linear weights (q, k, v, o, gate, up, down; the embedding, LM head, norms, biases, routers and routed experts stay fp32): fp32 (the one fp32 arena), bf16, q8_0 or q4_k (quantized from the fp32 or Hugging Face weights at load; q4_k needs every input width a multiple of 256), or gguf (the blocks a .gguf policy.path stores, e.g. Q4_1, with no fp32 copy; F32/F16/Q5_K/Q6_K tensors become q8_0). The GEMMs dequantize on the fly and only input gradients pass through the base. Anything but fp32 needs policy.lora.rank > 0 (a quantized base cannot be fine-tuned whole).");
  b.flag("policy.decode_graphs", [](C& c) { return &c.policy.decode_graphs; }, "On policy.device: cuda, run each decode step of a dense model as a CUDA graph once its shapes settle: the step's ops are recorded on the second step with the same rows, KV-cache length, weights and buffers, and replayed from then on (one launch instead of one per op). Any failure to record falls back to the ops one by one for the rest of the run (said once on stderr). MoE models and served adapters always decode op by op; the CPU backends ignore it. No GPU has run it yet.");
  b.flag("policy.cache_packed_metadata", [](C& c) { return &c.policy.cache_packed_metadata; }, "Optimization: build packed-sequence metadata once per batch, shared by every layer.");
  b.flag("policy.activation_checkpointing", [](C& c) { return &c.policy.activation_checkpointing; }, "Optimization: recompute each layer in backward from its saved input.");
  b.flag("policy.offload_activations", [](C& c) { return &c.policy.offload_activations; }, "Optimization: move checkpointed layer inputs to an offload store in host memory (needs activation_checkpointing): a copy thread on cpu, a copy stream into pinned memory on cuda.");
  b.flag("policy.offload_double_buffer", [](C& c) { return &c.policy.offload_double_buffer; }, "Optimization: reload layer l-1's input while layer l runs backward.");
  b.flag("policy.moe_grouped", [](C& c) { return &c.policy.moe_grouped; }, "Optimization: counting-sort grouped MoE routing instead of the masked loop.");
  b.integer("policy.logprob_chunk", [](C& c) { return &c.policy.logprob_chunk; }, 0, 1073741824, "Training log-probs: vocabulary columns per chunk of the LM head and log-softmax (online log-sum-exp; a per-token loss runs the head once over tiles of whole rows, as many as tokens x chunk floats hold but at least min(64, tokens / 4)), so no (tokens, vocab) logits buffer exists; 0 = the whole vocabulary at once. A vocabulary of at most one chunk is computed exactly as with 0; a larger one rounds differently (gradients equal to 1e-6 relative).");
  b.flag("policy.batch_invariant", [](C& c) { return &c.policy.batch_invariant; }, "Batch-invariant kernels: every op of a forward gives each token bits independent of the other rows of its batch and of KV-cache decode vs packed training forward (fixed-chain GEMMs for any row count, the decode step's attention loop in training, the learner's log-softmax for the sampler's log-probs), so sampler and learner agree exactly (logprob_diff_max 0, routing_agreement 1). Costs speed (the overhead is a troupe bench policy row); results differ in rounding from the default kernels.");
  b.enumeration("policy.moe.routing_replay", [](C& c) { return &c.policy.routing_replay; }, {{"off", policy::RoutingReplay::off}, {"rollout", policy::RoutingReplay::rollout}}, "MoE routing replay: rollout trains each response token on the top-k experts its sampler recorded (per MoE layer), with gates recomputed from the learner's own router logits over that set, in forward and backward; routing_agreement is then 1 by construction. off: the learner routes by its own top-k. An error on a dense model.");
  b.integer("policy.moe.expert_parallel", [](C& c) { return &c.policy.expert_parallel; }, 1, 4096, "Expert parallelism of the learners: E > 1 splits every MoE layer's routed experts over groups of E consecutive learner ranks (cluster.learners = data-parallel x E), each rank computing a contiguous block of num_experts / E experts for the tokens of every rank in its group; the routed rows travel by all-to-all (MPI_Alltoallv), grouped by expert, forward and backward. With learner.shard: none in a synchronous run each learner holds only its block of experts (their weights, gradients and AdamW moments; attention, routers, norms and embeddings stay whole on every learner): an expert's gradient is summed over the learners that hold it, the other gradients over all learners; no learner keeps the whole weights: each learner of the first group sends the generators its experts and 1/E of the rest (the weight sync from the blocks, weight_sync.transport zmq; the probe runs on the group), and each of them writes the same part of a checkpoint (a sharded checkpoint whose shards.json says layout expert_runs E; --resume, eval, generate, serve and troupe checkpoint consolidate read it as any other, and a resume may change E). With learner.shard optimizer or gradients, rollout.async or policy.lora (the frozen base and every adapter, the routed experts' included, on every learner), every learner holds every expert and only the compute is split; with learner.shard: parameters every learner keeps its ZeRO-3 shard of the whole model, each layer gathered with every expert's weights before its forward and backward, and computes its block of experts for the group's routed rows (a rank with fewer micro-batches serves its peers' rows in idle passes that take part in the same gathers and reduce-scatters), also beside policy.lora, distill.teacher and streamed parts, whose steps run on the whole trainable buffer gathered for the step (the step equals the same run with learner.shard: none bit for bit). distill.teacher's top-k pass and streamed parts (rollout.async_chunks > 1) run with the exchange too, every learner running as many passes as the one with the most micro-batches. The step equals the data-parallel step of the same global batch (bit for bit with 2 ranks and one micro-batch per rank, and with E = cluster.learners and one micro-batch per rank, where each micro-batch is one forward and backward; within float rounding otherwise). Any policy.device: the layer is the backend's; with cuda the rows travel over an NCCL all-to-all of the group's GPUs (its id made by the group's first rank and broadcast over MPI; this path builds but no GPU has run it), with cpu_fenced over MPI from host copies (tested bit for bit against cpu); divided learners sync the weights with weight_sync.transport zmq only; E must divide num_experts and cluster.learners. 1 = off.");
  b.integer("policy.lora.rank", [](C& c) { return &c.policy.lora.rank; }, 0, 65536, "LoRA rank r: train low-rank adapters A (r, in), B (out, r) beside the targeted linear layers of a frozen base (PEFT's layout and names); 0 = off, the whole model trains. The optimizer, checkpoints and weight sync then carry only the adapters. An error when r exceeds min(in, out) of a targeted layer.");
  b.number("policy.lora.alpha", [](C& c) { return &c.policy.lora.alpha; }, 0, 1e6, "LoRA alpha: the low-rank path is scaled by alpha / r (alpha / sqrt(r) with use_rslora).");
  b.number("policy.lora.dropout", [](C& c) { return &c.policy.lora.dropout; }, 0, 0.999, "Dropout on the low-rank path's input (PEFT's lora_dropout), in the learner's loss forward and backward only; masks from run.seed, the optimizer step and the micro-batch.");
  b.enum_list("policy.lora.targets", [](C& c) { return &c.policy.lora.targets; }, "Module kinds that get adapters: q, k, v, o (attention projections), gate, up, down (dense MLP and qwen2_moe's gated shared expert), experts (each routed MoE expert's gate, up and down: mlp.experts.N.gate_proj, Mixtral's block_sparse_moe.experts.N.w1; cpu backends only, no dropout), all_linear (all of them, never the LM head; on an MoE model the routed experts too). One name alone is a one-element list. A kind that matches no module of the model is an error.");
  b.enumeration("policy.lora.init", [](C& c) { return &c.policy.lora.init; }, "Adapter init (B = 0 either way, so a fresh adapter leaves the model unchanged): default (A kaiming-uniform with a = sqrt(5), PEFT's default) or gaussian (A ~ N(0, 1/r)); drawn from run.seed.");
  b.flag("policy.lora.use_rslora", [](C& c) { return &c.policy.lora.use_rslora; }, "Rank-stabilized LoRA: scale by alpha / sqrt(r) instead of alpha / r.");
  b.number("policy.lora.lr", [](C& c) { return &c.policy.lora.lr; }, 0, 10, "Peak learning rate of the adapters, in both phases (0 = optimizer.lr, or sft.lr in SFT); with LoRA on the adapters are all that trains.");
  b.enumeration("policy.model.family", [](C& c) { return &c.policy.model.family; }, {{"qwen3_moe", policy::ModelFamily::qwen3_moe}, {"mixtral", policy::ModelFamily::mixtral}}, "Model family (Hugging Face layout of checkpoints): qwen3_moe has per-head q/k RMSNorm.");
  b.integer("policy.model.vocab_size", [](C& c) { return &c.policy.model.vocab_size; }, 2, 1048576, "V: vocabulary size (must cover the tokenizer).");
  b.integer("policy.model.hidden_size", [](C& c) { return &c.policy.model.hidden_size; }, 1, 65536, "C: model width.");
  b.integer("policy.model.num_hidden_layers", [](C& c) { return &c.policy.model.num_hidden_layers; }, 1, 1024, "L: number of transformer layers.");
  b.integer("policy.model.num_attention_heads", [](C& c) { return &c.policy.model.num_attention_heads; }, 1, 1024, "Query heads.");
  b.integer("policy.model.num_key_value_heads", [](C& c) { return &c.policy.model.num_key_value_heads; }, 1, 1024, "Key/value heads (GQA); divides num_attention_heads.");
  b.integer("policy.model.head_dim", [](C& c) { return &c.policy.model.head_dim; }, 1, 4096, "Width of one attention head.");
  b.integer("policy.model.intermediate_size", [](C& c) { return &c.policy.model.intermediate_size; }, 1, 1048576, "Hidden size of dense SwiGLU layers (mlp_only_layers).");
  b.integer("policy.model.num_experts", [](C& c) { return &c.policy.model.num_experts; }, 0, 4096, "E: routed experts per MoE layer (0 = every layer dense).");
  b.integer("policy.model.num_experts_per_tok", [](C& c) { return &c.policy.model.num_experts_per_tok; }, 1, 64, "K: experts each token is routed to (<= num_experts).");
  b.integer("policy.model.moe_intermediate_size", [](C& c) { return &c.policy.model.moe_intermediate_size; }, 1, 1048576, "H: hidden size of each routed expert.");
  b.flag("policy.model.norm_topk_prob", [](C& c) { return &c.policy.model.norm_topk_prob; }, "Renormalize the top-k router weights to sum to 1.");
  b.integer("policy.model.shared_expert_intermediate_size", [](C& c) { return &c.policy.model.shared_expert_intermediate_size; }, 0, 1048576, "Hidden size of the shared expert (0 = none).");
  b.int_list("policy.model.mlp_only_layers", [](C& c) { return &c.policy.model.mlp_only_layers; }, 0, 1023, "Layers with a dense SwiGLU instead of MoE, e.g. [0].");
  b.number("policy.model.rope_theta", [](C& c) { return &c.policy.model.rope_theta; }, 1, 1e9, "RoPE base.");
  b.number("policy.model.rms_norm_eps", [](C& c) { return &c.policy.model.rms_norm_eps; }, 1e-12, 1e-1, "RMSNorm epsilon.");
  b.flag("policy.model.tie_word_embeddings", [](C& c) { return &c.policy.model.tie_word_embeddings; }, "Share the embedding and LM-head matrices.");
  b.number("policy.model.router_aux_loss_coef", [](C& c) { return &c.policy.model.router_aux_loss_coef; }, 0, 10, "Weight of the load-balancing loss (0 = off).");
  b.integer("policy.model.max_position_embeddings", [](C& c) { return &c.policy.model.max_position_embeddings; }, 1, 1048576, "Longest sequence (prompt + response) the model takes.");

}

// sft, grpo, loss, optimizer.
void add_training_keys(Builder<ExperimentConfig>& b) {
  using C = ExperimentConfig;
  // sft
  b.flag("sft.enabled", [](C& c) { return &c.sft.enabled; }, "Run an SFT warm-up phase (on the envs' reference answers) before GRPO.");
  b.integer("sft.max_steps", [](C& c) { return &c.sft.max_steps; }, 0, 10000000, "SFT optimizer steps.");
  b.integer("sft.batch_size", [](C& c) { return &c.sft.batch_size; }, 1, 1048576, "Prompt/completion pairs per SFT step.");
  b.number("sft.lr", [](C& c) { return &c.sft.lr; }, 0, 10, "Peak learning rate of the SFT phase (0 = optimizer.lr).");

  // grpo
  b.flag("grpo.enabled", [](C& c) { return &c.grpo.enabled; }, "Run the GRPO phase.");
  b.integer("grpo.max_steps", [](C& c) { return &c.grpo.max_steps; }, 0, 10000000, "GRPO steps (one generation batch each).");
  b.integer("grpo.num_iterations", [](C& c) { return &c.grpo.num_iterations; }, 1, 64, "Optimization passes over one generation batch (PPO epochs).");
  b.integer("grpo.micro_batch_tokens", [](C& c) { return &c.grpo.micro_batch_tokens; }, 0, 1e9, "Token budget per micro-batch with gradient accumulation (0 = one micro-batch per learner).");
  b.enumeration("grpo.adv_estimator", [](C& c) { return &c.grpo.adv_estimator; }, {{"grpo", AdvantageEstimator::grpo}, {"rloo", AdvantageEstimator::rloo}, {"reinforce_pp", AdvantageEstimator::reinforce_pp}}, "Baseline: group mean (grpo), leave-one-out (rloo), or batch-normalized REINFORCE++.");
  b.enumeration("grpo.scale_rewards", [](C& c) { return &c.grpo.scale_rewards; }, {{"group", StdMode::group}, {"batch", StdMode::batch}, {"none", StdMode::none}}, "Divide advantages by the group std, the batch std, or nothing (Dr. GRPO).");
  b.number("grpo.reward_clip", [](C& c) { return &c.grpo.reward_clip; }, 0, 1e6, "Clip rewards to [-c, c] before advantages (0 = off).");
  b.flag("grpo.dynamic_sampling", [](C& c) { return &c.grpo.dynamic_sampling; }, "DAPO dynamic sampling: drop groups whose rewards are all equal and generate more prompt groups until rollout.prompts_per_step groups are kept (at most grpo.max_generation_rounds rounds; metrics groups_kept, generation_rounds).");
  b.integer("grpo.max_generation_rounds", [](C& c) { return &c.grpo.max_generation_rounds; }, 1, 1000, "Dynamic sampling: generation rounds of rollout.prompts_per_step prompts per step at most (veRL max_num_gen_batches); when reached, train on the groups kept so far.");
  b.flag("grpo.mask_truncated", [](C& c) { return &c.grpo.mask_truncated; }, "No loss on completions cut at max_response_length.");

  // loss
  b.number("loss.clip_low", [](C& c) { return &c.loss.clip_low; }, 0, 1, "epsilon_low of the clipped ratio (1 - eps_low).");
  b.number("loss.clip_high", [](C& c) { return &c.loss.clip_high; }, 0, 10, "epsilon_high of the clipped ratio (1 + eps_high; DAPO raises it).");
  b.number("loss.dual_clip", [](C& c) { return &c.loss.dual_clip; }, 0, 100, "Dual-clip constant c > 1 for negative advantages (0 = off).");
  b.number("loss.kl_coef", [](C& c) { return &c.loss.kl_coef; }, 0, 100, "beta of the KL penalty to the initial policy (0 = no reference model kept).");
  b.enumeration("loss.kl_type", [](C& c) { return &c.loss.kl_type; }, {{"k1", KlEstimator::k1}, {"k2", KlEstimator::k2}, {"k3", KlEstimator::k3}}, "KL estimator.");
  b.number("loss.kl_input_clamp", [](C& c) { return &c.loss.kl_input_clamp; }, 0, 1e6, "Clamp of (ref - logp) before the estimator (NeMo RL).");
  b.number("loss.kl_output_clamp", [](C& c) { return &c.loss.kl_output_clamp; }, 0, 1e6, "Clamp of the per-token KL value.");
  b.number("loss.entropy_coef", [](C& c) { return &c.loss.entropy_coef; }, 0, 10, "Entropy bonus weight (0 = off).");
  b.enumeration("loss.agg_mode", [](C& c) { return &c.loss.agg_mode; }, {{"token-mean", LossAggMode::token_mean}, {"seq-mean-token-mean", LossAggMode::seq_mean_token_mean}, {"seq-mean-token-sum-norm", LossAggMode::seq_mean_token_sum_norm}}, "Loss aggregation: token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr. GRPO).");
  b.integer("loss.agg_norm_length", [](C& c) { return &c.loss.agg_norm_length; }, 0, 1048576, "Constant of seq-mean-token-sum-norm (0 = rollout.max_response_length * rollout.max_turns).");
  b.flag("loss.sequence_level_ratio", [](C& c) { return &c.loss.sequence_level_ratio; }, "Sequence-level importance ratio (GSPO).");
  b.enumeration("loss.mismatch_correction", [](C& c) { return &c.loss.mismatch_correction; }, {{"none", learner::MismatchCorrection::none}, {"tis", learner::MismatchCorrection::tis}, {"mis", learner::MismatchCorrection::mis}, {"seq_geo_mask", learner::MismatchCorrection::seq_geo_mask}, {"icepop", learner::MismatchCorrection::icepop}}, "Correction of the sampler/learner log-prob gap. With one set, the PPO ratio is taken against the learner's own log-probs and each token's policy-gradient term is weighted by a detached w of rho = pi_learner / pi_sampler: tis w = min(rho, loss.tis_cap) (truncated importance sampling); mis w = rho inside [loss.mis_low, loss.mis_high], else 0 (masked importance sampling); seq_geo_mask w = 1 for the tokens of a sequence whose geometric-mean rho is inside [loss.geo_mask_low, loss.geo_mask_high], else 0; icepop w = rho inside [loss.icepop_low, loss.icepop_high], else 0 (IcePop). It replaces rollout.importance_weight_cap's truncation of stale async samples. none: the sampler's log-probs are the old policy of the ratio.");
  b.number("loss.tis_cap", [](C& c) { return &c.loss.tis_cap; }, 1e-6, 1e6, "mismatch_correction tis: cap of the importance weight.");
  b.number("loss.mis_low", [](C& c) { return &c.loss.mis_low; }, 0, 1e6, "mismatch_correction mis: tokens with rho below this are dropped (0 = one-sided).");
  b.number("loss.mis_high", [](C& c) { return &c.loss.mis_high; }, 1e-6, 1e6, "mismatch_correction mis: tokens with rho above this are dropped.");
  b.number("loss.geo_mask_low", [](C& c) { return &c.loss.geo_mask_low; }, 0, 1e6, "mismatch_correction seq_geo_mask: sequences whose geometric-mean rho is below this are dropped.");
  b.number("loss.geo_mask_high", [](C& c) { return &c.loss.geo_mask_high; }, 1e-6, 1e6, "mismatch_correction seq_geo_mask: sequences whose geometric-mean rho is above this are dropped.");
  b.number("loss.icepop_low", [](C& c) { return &c.loss.icepop_low; }, 0, 1e6, "mismatch_correction icepop: alpha, the lower bound of the kept ratios.");
  b.number("loss.icepop_high", [](C& c) { return &c.loss.icepop_high; }, 1e-6, 1e6, "mismatch_correction icepop: beta, the upper bound of the kept ratios.");

  // optimizer
  b.enumeration("optimizer.name", [](C& c) { return &c.optimizer.name; }, {{"adamw", learner::OptimizerKind::adamw}}, "Optimizer.");
  b.number("optimizer.lr", [](C& c) { return &c.optimizer.lr; }, 0, 10, "Peak learning rate.");
  b.number("optimizer.weight_decay", [](C& c) { return &c.optimizer.weight_decay; }, 0, 10, "Decoupled weight decay.");
  b.number("optimizer.beta1", [](C& c) { return &c.optimizer.beta1; }, 0, 0.999999, "AdamW beta1.");
  b.number("optimizer.beta2", [](C& c) { return &c.optimizer.beta2; }, 0, 0.99999999, "AdamW beta2.");
  b.number("optimizer.eps", [](C& c) { return &c.optimizer.eps; }, 1e-20, 1, "AdamW epsilon.");
  b.number("optimizer.max_grad_norm", [](C& c) { return &c.optimizer.max_grad_norm; }, 0, 1e6, "Clip gradients to this global norm (0 = off).");
  b.integer("optimizer.warmup_steps", [](C& c) { return &c.optimizer.warmup_steps; }, 0, 10000000, "Linear warm-up steps (per phase).");
  b.enumeration("optimizer.schedule", [](C& c) { return &c.optimizer.schedule; }, {{"constant", LrSchedule::constant}, {"cosine", LrSchedule::cosine}}, "Learning-rate schedule after warm-up.");
  b.number("optimizer.min_lr_ratio", [](C& c) { return &c.optimizer.min_lr_ratio; }, 0, 1, "Cosine floor as a fraction of the peak.");

  // learner
  b.enumeration("learner.shard", [](C& c) { return &c.learner.shard; }, "How the learner ranks (cluster.learners) split the training state of the flat fp32 buffer (ZeRO stages): none = plain data parallel, every rank holds the parameters, gradients and both AdamW moments; optimizer = ZeRO-1: each rank holds the AdamW moments of its contiguous shard only, the gradient is summed on every rank, each rank updates its shard and the shards are all-gathered; gradients = ZeRO-2: as optimizer, but the gradient is reduce-scattered (each rank sums only its shard); parameters = ZeRO-3: each rank also keeps only its shard of the parameters and gradients; a decoder layer's weights (or the embedding's, or the head's) are all-gathered just before its forward and again before its backward and dropped after, and each layer's gradient is reduce-scattered once the step's last micro-batch has run its backward (full-parameter training with an fp32 base; on a device model -- cuda, cpu_fenced -- the weights and gradients are a sparse device arena into which each layer is mapped for its gather and unmapped after, the gathers blocking; LoRA adapters, a quantized base, learner.optimizer_offload on a device, distill.teacher runs and the streamed steps of rollout.async_chunks > 1 take the whole trainable buffer gathered for the step instead; with policy.moe.expert_parallel each gathered MoE layer computes this rank's block of experts, the routed rows exchanged over the expert-parallel group, beside policy.lora, distill.teacher and streamed parts too); under troupe run each learner keeps only its shard between steps where the weights sync from the shards (weight_sync.transport zmq), learner 0 the whole weights with weight_sync.transport nccl, and every learner the whole weights in async runs. Every stage computes the step of none bit for bit on CPU (the sum runs in rank order, the gradient norm front to back). On a device model (policy.device cuda, cpu_fenced) every stage steps on the device: the device collective (NCCL on cuda) reduce-scatters the gradients and all-gathers the weights, each learner's shard of the AdamW moments lives on its device (cpu_fenced: bit for bit the cpu step); with parameters the device keeps its shard of the weights and gradients between steps (where the arena can be sparse, above; else they stay whole and parameters divides what gradients does); with one learner all are none. Checkpoints of a stage other than none: every learner writes its own shard of the weights and AdamW moments in parallel (checkpoints/step_N/shards/rank_R.safetensors, laid out by shards.json); troupe eval --checkpoint, generate and serve read them, troupe checkpoint consolidate writes the Hugging Face directory. A --resume may change it, and the learner count (the shards are read back at any count).");
  b.flag("learner.optimizer_offload", [](C& c) { return &c.learner.optimizer_offload; }, "Where AdamW runs for a model on a device (policy.device: cuda, cpu_fenced). false: on the device -- the fp32 moments live beside the master weights, the gradients are summed there (NCCL when there are several learners), clipped and stepped there and never come down; the host mirror of the weights is brought down only where a checkpoint or a weight sync reads it. true: the gradients come down each step and AdamW runs on the host mirror with the moments in host memory (for a model whose weights fit the GPU but whose moments do not). Both compute the same step (bit for bit on cpu_fenced). Sharded learners (learner.shard other than none): the device step is the sharded one (each learner's shard of the moments on its device, the gradients reduce-scattered and the weights all-gathered by the device collective, NCCL on cuda, or over MPI from host copies where the backend has none, cpu_fenced). policy.device: cpu refuses true (its optimizer already runs in host memory). A --resume may change it.");
  b.text("learner.memory_budget", [](C& c) { return &c.learner.memory_budget; }, "Memory each rank may use, e.g. 4GiB, 80GB, 512MiB (binary KiB/MiB/GiB/TiB or decimal kB/MB/GB/TB; a plain number is bytes): troupe run and troupe validate plan every rank's memory (troupe plan: weights, gradients, optimizer state, activations, KV cache, sync and collective buffers, on the rank's device: host memory on cpu, GPU memory on cuda) and refuse a config whose plan exceeds it, naming the role, rank and overflow. Empty = no budget.");

}

// distill (on-policy distillation from a teacher on the scorers).
void add_distill_keys(Builder<ExperimentConfig>& b) {
  using C = ExperimentConfig;
  b.text("distill.teacher", [](C& c) { return &c.distill.teacher; }, "On-policy distillation: the teacher model (a model directory or .gguf, as policy.path), served frozen by the scorers (needs cluster.scorers >= 1); its tokenizer must be the student's (else an error at start naming both tokenizers' hashes). Each sampled token's per-token advantage becomes coef x (log p_teacher - log p_student), the student's log-prob being the learner's own recompute; the env reward's GRPO advantage is added times reward_coef. Empty = off.");
  b.number("distill.coef", [](C& c) { return &c.distill.coef; }, 0, 1e6, "Weight of the reverse-KL advantage coef x (log p_teacher - log p_student) per sampled token (and of the top-k term).");
  b.enumeration("distill.kind", [](C& c) { return &c.distill.kind; }, "The distillation objective: reverse_kl (the sampled-token estimate of KL(student || teacher) as a per-token advantage, as Thinking Machines' on-policy distillation, NeMo RL and TRL's GKD with lambda 1 do).");
  b.integer("distill.topk", [](C& c) { return &c.distill.topk; }, 0, 1024, "> 0: also a forward-KL term over the teacher's k most likely tokens at each completion position, sum_j p_T(j) (log p_T(j) - log p_S(j)) (p_T not renormalised over the k), its gradient through the student's log-probs of those tokens (one more forward/backward over k copies of each sample). 0 = off.");
  b.number("distill.reward_coef", [](C& c) { return &c.distill.reward_coef; }, 0, 1e6, "Adds reward_coef x the env reward's GRPO advantage (grpo.adv_estimator, scale_rewards) to each token's distillation advantage; 0 = distillation alone.");
  b.number("distill.timeout_s", [](C& c) { return &c.distill.timeout_s; }, 0.1, 86400, "Deadline of one teacher request to a scorer; a request past it (or failed, or to a dead scorer) is retried on the next scorer.");
  b.integer("distill.max_retries", [](C& c) { return &c.distill.max_retries; }, 0, 1000, "Retries of a failed teacher request (each on the next scorer) before the step fails with exit 3; every failure and retry is counted (scorer/failures, scorer/retries).");
  b.enumeration("distill.teacher_dtype", [](C& c) { return &c.distill.teacher_dtype; }, "GEMM precision of the teacher's log-prob forwards on the scorers: fp32, or bf16 (on policy.device: cpu with AVX512-BF16: every projection and the log-prob head read the weights rounded to bf16, packed once at their first use, about 2 bytes per parameter more, and the activations rounded to bf16, accumulating in fp32; norms, attention, the log-softmax stay fp32). bf16 log-probs are as deterministic as fp32 ones (the same bits every run, whatever the thread count) but differ from them by bf16 rounding (measured on SmolLM2-135M: mean |difference| 0.025 nats, max 0.55; docs/benchmarks.md). Elsewhere (cuda, a CPU without AVX512-BF16) the teacher runs fp32. Judges and reward models always run fp32.");
}

// envs, rollout, weight_sync.
void add_rollout_keys(Builder<ExperimentConfig>& b) {
  using C = ExperimentConfig;
  // envs: a list; its entries' keys are in env_entry_schema()
  b.mapping("envs", [](C& c) { return static_cast<nlohmann::json*>(nullptr); }, "List of environments; each entry has the keys envs[].* below.");

  // rollout
  b.number("rollout.temperature", [](C& c) { return &c.rollout.temperature; }, 0, 10, "Sampling temperature (0 = greedy); log-probs are taken at this temperature.");
  b.number("rollout.top_p", [](C& c) { return &c.rollout.top_p; }, 0.000001, 1, "Nucleus sampling (1 = off).");
  b.integer("rollout.top_k", [](C& c) { return &c.rollout.top_k; }, 0, 1048576, "Top-k sampling (0 = off).");
  b.integer("rollout.max_prompt_length", [](C& c) { return &c.rollout.max_prompt_length; }, 1, 1048576, "Prompt tokens kept (longer prompts are cut from the left; recorded).");
  b.integer("rollout.max_response_length", [](C& c) { return &c.rollout.max_response_length; }, 1, 1048576, "Response tokens per turn (longer ones are truncated; truncated_frac).");
  b.integer("rollout.num_generations", [](C& c) { return &c.rollout.num_generations; }, 1, 4096, "G: completions sampled per prompt (one group).");
  b.integer("rollout.prompts_per_step", [](C& c) { return &c.rollout.prompts_per_step; }, 1, 1048576, "Prompts (groups) per GRPO step.");
  b.string_list("rollout.stop", [](C& c) { return &c.rollout.stop; }, "Stop strings besides EOS; the response ends after the first one.");
  b.enumeration("rollout.template", [](C& c) { return &c.rollout.template_name; }, "Prompt format: plain (system prompt + text; the env's messages are ignored) or chat: the model's chat template (policy.path's chat_template.jinja or tokenizer_config.json) renders the env's messages (its observation's system prompt and few-shot turns, when it gives any; else the text as one user turn, after rollout.system_prompt) with the generation prompt, encoded without adding BOS; a model without a template gets the built-in <|system|>/<|user|>/<|assistant|> tags after BOS. Multi-turn under chat: each env answer is the template's user or tool turn, only its tokens appended (actors/README.md, Multi-turn chat).");
  b.text("rollout.system_prompt", [](C& c) { return &c.rollout.system_prompt; }, "Prepended to every prompt (empty = none); chat: a system message, unless the env's messages have one.");
  b.integer("rollout.max_turns", [](C& c) { return &c.rollout.max_turns; }, 1, 1024, "Turns per episode for multi-turn envs. Each later turn's prompt is the previous context's tokens + the tokens sampled + the env's answer (mask 0): plain, \"\\n\" + answer + \"\\n\"; chat, the template's next turn.");
  b.flag("rollout.async", [](C& c) { return &c.rollout.async; }, "Async mode: generators keep sampling with version v while learners train v+1.");
  b.integer("rollout.max_staleness", [](C& c) { return &c.rollout.max_staleness; }, 0, 1024, "Async: oldest policy version lag a trajectory may have.");
  b.integer("rollout.async_chunks", [](C& c) { return &c.rollout.async_chunks; }, 1, 1048576, "Async: each step's prompts are generated in this many parts, and the learners start on a part (accumulating its gradient) as soon as it is scored; the optimizer step follows the last part. The update equals the whole batch's up to rounding. 1 = the whole batch at once. Needs one on-policy update per batch (grpo.num_iterations 1, no dynamic sampling), single-turn envs and group-local advantages (scale_rewards group or none, adv_estimator grpo or rloo).");
  b.enumeration("rollout.stale_policy", [](C& c) { return &c.rollout.stale_policy; }, "Async: how trajectories sampled by older weights are trained on. The scheduler never starts a rollout on weights more than max_staleness versions old. drop: the PPO ratio is taken against the sampler's log-probs (tokens that moved are clipped), and a trajectory past max_staleness would be dropped (stale_dropped). importance_weight: decoupled PPO, the ratio against the learner's current weights and each token's policy-gradient term weighted by min(pi_current / pi_sampler, importance_weight_cap) (truncated importance sampling; is_weight_mean in the metrics).");
  b.number("rollout.importance_weight_cap", [](C& c) { return &c.rollout.importance_weight_cap; }, 1, 1000, "stale_policy importance_weight: truncation of the importance weight (veRL's TIS cap is 2).");
  b.flag("rollout.in_flight_updates", [](C& c) { return &c.rollout.in_flight_updates; }, "Async: a generator takes newer weights between decode steps instead of finishing its episodes on the version the rollout started with. Step k's rollout starts with its pinned version (the learners' after step k - max_staleness - 1); before decode step i * in_flight_every it moves to the learners' version after step k - max_staleness - 1 + i (waiting for it; at most the version after step k - 1, and after no step past an eval or checkpoint that drains it), so the switch points depend on the config only. The KV cache of older tokens is kept. Each completion token records its version; mismatch metrics and the off-policy correction use the per-token behaviour log-probs and versions. Needs max_staleness >= 1, single-turn envs, async_chunks 1, no rollout.serve.");
  b.integer("rollout.in_flight_every", [](C& c) { return &c.rollout.in_flight_every; }, 1, 1048576, "in_flight_updates: decode steps between two weight switches of a generation.");
  b.integer("rollout.in_flight_min_lag", [](C& c) { return &c.rollout.in_flight_min_lag; }, 1, 1024, "in_flight_updates: step k's rollout moves at most to the learners' version after step k - in_flight_min_lag. 1: the freshest that can exist while step k is untrained (the rollout's last tokens wait for step k - 1's update, so the learners wait for them); 2: never waits for the step the learners train while the rollout finishes (needs max_staleness >= 2 to switch at all).");
  b.text("rollout.serve", [](C& c) { return &c.rollout.serve; }, "HOST:PORT (loopback): every generator also serves its current policy weights over the OpenAI-compatible routes of troupe serve (generator i on PORT + i; port 0: a free one, logged). Requests for an episode (the model name episodes/EPISODE_ID, the base URL .../episodes/EPISODE_ID/v1, or the X-Troupe-Episode header) are recorded token for token into that episode and trained on; other requests are served and not recorded. Envs of type verifiers need it. Empty = off.");
  b.integer("rollout.serve_slots", [](C& c) { return &c.rollout.serve_slots; }, 1, 4096, "rollout.serve: sequences the endpoint samples together (continuous batching over a copy of the generator's weights).");

  // weight_sync
  b.enumeration("weight_sync.mode", [](C& c) { return &c.weight_sync.mode; }, "How learner 0's weights reach the generators after each update (docs/weight_sync.md). delta: the XOR of the new bits and those of the version the generator holds, in byte planes, zstd-compressed (only what changed costs bytes; lossless: fp32 generators then hold the master bit for bit); the full weights go at the start, to a generator that has none acknowledged yet, after a checksum failure or a refused delta, and every full_every versions. full: every sync sends every value. Each tensor is checksummed (xxh3-64) either way.");
  b.integer("weight_sync.full_every", [](C& c) { return &c.weight_sync.full_every; }, 0, kIntMax, "delta mode: a version divisible by this goes to the generators in full (bounds how long a delta chain gets; 0 = only when needed).");
  b.enumeration("weight_sync.dtype", [](C& c) { return &c.weight_sync.dtype; }, "The generators' weights: fp32 (the learner's master as it is: exact on-policy sampling) or bf16 (the master rounded to the nearest bf16, ties to even; still computed in fp32). bf16 halves a full sync, and a small update leaves most bf16 values unchanged, so deltas get far smaller; the sampler then differs from the learner by that rounding (the mismatch metrics show it). Not with policy.batch_invariant.");
  b.enumeration("weight_sync.transport", [](C& c) { return &c.weight_sync.transport; }, "How the weights' values travel. zmq: in the Weights message (delta or full, weight_sync.mode). nccl: learner 0 and every generator join one device collective at the first sync (the weight group: an NCCL communicator with policy.device cuda, every member in a process of its own on a GPU of its own; in-process with cpu_fenced, every member in one process) and learner 0 broadcasts the values in the generators' dtype, device to device; the Weights message then carries only their version, per-tensor checksums and probe, and each generator checks them as it would a full sync. Needs policy.device cuda or cpu_fenced. Once a generator is down the group is not used again and the weights go over ZeroMQ.");
  b.flag("weight_sync.prepare_in_step", [](C& c) { return &c.weight_sync.prepare_in_step; }, "bf16 deltas over zmq: learner 0's optimizer step hands each block of new master values, while still in cache, to the weight encoder, which compares it with what the generators hold, records the changes and hashes the tensor there; the sync then only compresses and sends (the same message, bit for bit, without reading the 4-byte master again). The work moves rather than shrinks (learner 0's step takes about as much longer as the sync gets shorter), so the generators get new weights sooner after the step; false: the sync does it all, reading the master once more. Only the last optimizer step of a train step prepares. Not used with fp32 (every value changes), mode full or transport nccl.");
  b.integer("weight_sync.relay_fanout", [](C& c) { return &c.weight_sync.relay_fanout; }, 0, 1024, "transport zmq: the most generators one sender passes a version to. With more live generators than this, the weights go down a relay tree (docs/weight_sync.md, \"Relay tree\"): learner 0's rank sends each version to relay_fanout generators, and each generator passes it on, part by part as the parts arrive, to at most relay_fanout others, so learner 0's link carries relay_fanout copies instead of one per generator. Every generator checks the checksums and the probe of what it received, as from learner 0; a relay that dies is routed around (its parent sends to its children). 0 or 1: every generator gets the weights from learner 0's rank (the star), as do runs with at most relay_fanout generators; the weights are the same bit for bit either way.");
  b.flag("weight_sync.probe", [](C& c) { return &c.weight_sync.probe; }, "After each sync every generator computes the log-probs of a fixed 32-token probe sequence with its new weights and compares them, bit for bit, with those learner 0 computed with the same weights in the generators' dtype; a mismatch is an error naming the generator, the version and the first differing position (and that generator refuses to sample).");

}

// cluster.
void add_cluster_keys(Builder<ExperimentConfig>& b) {
  using C = ExperimentConfig;
  // cluster
  b.integer("cluster.learners", [](C& c) { return &c.cluster.learners; }, 1, 4096, "Learner ranks (data parallel).");
  b.integer("cluster.generators", [](C& c) { return &c.cluster.generators; }, 1, 4096, "Rollout generator ranks.");
  b.integer("cluster.env_workers", [](C& c) { return &c.cluster.env_workers; }, 1, 4096, "Env worker ranks.");
  b.enumeration("cluster.transport", [](C& c) { return &c.cluster.transport; }, "Transport between ranks under mpirun (one process always uses inproc).");
  b.text("cluster.bind_host", [](C& c) { return &c.cluster.bind_host; }, "tcp: where each rank listens: an IPv4 address of its node or an interface name (e.g. eth0), resolved on the rank's own node, so one config serves hosts of different addresses (127.0.0.1 = this machine only; a wildcard such as 0.0.0.0 is refused: peers could not reach it).");
  b.number("cluster.heartbeat_s", [](C& c) { return &c.cluster.heartbeat_s; }, 0.01, 3600, "Heartbeat period between ranks.");
  b.number("cluster.peer_timeout_s", [](C& c) { return &c.cluster.peer_timeout_s; }, 0.1, 86400, "A peer silent this long is declared dead (exit 3).");
  b.integer("cluster.threads", [](C& c) { return &c.cluster.threads; }, 0, 4096, "Compute threads per rank (0 = cores / ranks on the node).");
  b.integer("cluster.generator_threads", [](C& c) { return &c.cluster.generator_threads; }, 0, 4096, "Compute threads of each generator (0 = cluster.threads). In one process the roles share the cores (each runs its own OpenMP team of this size).");
  b.integer("cluster.learner_threads", [](C& c) { return &c.cluster.learner_threads; }, 0, 4096, "Compute threads of each learner (0 = cluster.threads).");
  b.flag("cluster.curve", [](C& c) { return &c.cluster.curve; }, "tcp between ranks encrypted and authenticated with ZeroMQ CURVE (for real networks); needs transport tcp and the three key files below.");
  b.text("cluster.curve_public_key", [](C& c) { return &c.cluster.curve_public_key; }, "CURVE: this rank's public key file (Z85 text, written by `troupe keygen PUBLIC SECRET`); relative paths start at the YAML's folder.");
  b.text("cluster.curve_secret_key", [](C& c) { return &c.cluster.curve_secret_key; }, "CURVE: this rank's secret key file (mode 0600).");
  b.text("cluster.curve_authorized_keys", [](C& c) { return &c.cluster.curve_authorized_keys; }, "CURVE: file listing the public key of every rank allowed to connect, one per line ('#' comments); others are refused.");
  b.flag("cluster.join", [](C& c) { return &c.cluster.join; }, "Members may join the running job: `troupe join RUN_DIR|ADDRESS --role generator|scorer` on any host attaches a generator or scorer over tcp (needs transport tcp; in one process the process then listens on bind_host too; under mpirun as well as in one process, sync or async); `--role env --env NAME --env-address ADDR` adds a running env server to the pool of an env served by envs[].addresses. Rank 0's address and CURVE public key go to RUN_DIR/join.json. Generators and scorers are admitted at the next weight sync (the full weights first), env servers at once; joiners are authenticated by cluster.curve's keys when it is on, and refused by name when their model hash differs (or the env has no pool); one that leaves (SIGTERM) drains its work first, one that dies is declared down after cluster.peer_timeout_s and its in-flight episodes are generated again by the other generators (exactly once; docs/architecture.md, Membership).");
  b.integer("cluster.scorers", [](C& c) { return &c.cluster.scorers; }, 0, 4096, "Scorer ranks: each serves every frozen model of the run (distill.teacher, each judge's local model, each reward_model env's model), placed as generators are (under mpirun one rank each, after the env workers; the same policy.device and GPU rules), batching the requests of every rollout (continuous batching; a sequence's numbers never depend on its batch: log-probs one sequence per forward, generations and reward scores batch-invariant); no optimizer, no gradients. 0 = none.");
  b.integer("cluster.scorer_threads", [](C& c) { return &c.cluster.scorer_threads; }, 0, 4096, "Compute threads of each scorer (0 = cluster.threads).");
  b.integer("cluster.generator_nice", [](C& c) { return &c.cluster.generator_nice; }, 0, 19, "Generators sample on their own threads at this OS priority (nice; 0 = as the process). With roles sharing cores in async mode, 19 lets the learner run at full speed and sampling take the cycles it leaves.");

}

// checkpointing, logger, eval, faults.
void add_output_keys(Builder<ExperimentConfig>& b) {
  using C = ExperimentConfig;
  // checkpointing
  b.flag("checkpointing.enabled", [](C& c) { return &c.checkpointing.enabled; }, "Write checkpoints/step_N/ (model dir + optimizer + state).");
  b.integer("checkpointing.every", [](C& c) { return &c.checkpointing.every; }, 0, 10000000, "Checkpoint every N steps (0 = at the end of each phase only).");
  b.integer("checkpointing.keep_last", [](C& c) { return &c.checkpointing.keep_last; }, 1, 1000000, "Keep the last K checkpoints.");
  b.text("checkpointing.keep_best_by", [](C& c) { return &c.checkpointing.keep_best_by; }, "Also keep the best checkpoint by this eval metric (e.g. eval_accuracy; empty = off); an eval that beats the best so far is checkpointed at once, also between `every` steps, and checkpoints/best points to it.");
  b.flag("checkpointing.higher_is_better", [](C& c) { return &c.checkpointing.higher_is_better; }, "Direction of keep_best_by.");

  // logger
  b.flag("logger.tensorboard", [](C& c) { return &c.logger.tensorboard; }, "Write TensorBoard event files to tb/ (metrics.jsonl is always written).");
  b.enumeration("logger.progress", [](C& c) { return &c.logger.progress; }, "Progress display: auto (tty on a terminal, else plain log lines).");
  b.flag("logger.trajectories", [](C& c) { return &c.logger.trajectories; }, "Write sampled trajectories to trajectories/*.jsonl.");
  b.integer("logger.trajectories_per_step", [](C& c) { return &c.logger.trajectories_per_step; }, 0, 1048576, "At most this many trajectories written per step.");
  b.text("logger.wandb.project", [](C& c) { return &c.logger.wandb.project; }, "Weights & Biases project: every metrics.jsonl row also goes to a W&B run (numeric fields, named as the TensorBoard scalars: <phase>/<field>, eval rows eval/<field>, at the row's step) through the real wandb package, run by $TROUPE_PYTHON (default: the build's Python) in a process of its own; its files under run.dir/wandb/, its output in run.dir/logs/wandb.log. A Python without wandb is an error at start; a W&B process that dies later is logged once and the run goes on without it. Empty = off.");
  b.text("logger.wandb.name", [](C& c) { return &c.logger.wandb.name; }, "Name of the W&B run (empty = run.name).");
  b.enumeration("logger.wandb.mode", [](C& c) { return &c.logger.wandb.mode; }, "W&B mode: online (needs a login: wandb login or WANDB_API_KEY), offline (everything kept under run.dir/wandb/; upload later with wandb sync), disabled (no W&B process is started).");

  // eval
  b.integer("eval.every", [](C& c) { return &c.eval.every; }, 0, 10000000, "Evaluate on the held-out split every K steps (0 = only at the end of each phase).");
  b.integer("eval.num_prompts", [](C& c) { return &c.eval.num_prompts; }, 1, 1048576, "Held-out prompts per env and evaluation (greedy).");
  b.flag("eval.at_start", [](C& c) { return &c.eval.at_start; }, "Also evaluate before the first step.");

  // faults (off by default; docs/reliability.md)
  b.integer("faults.seed", [](C& c) { return &c.faults.seed; }, 0, kIntMax, "Fault injection: which calls the env fault probabilities below hit is a hash of this seed, the env worker and the call (episode id or payload), so a run with faults is as reproducible as one without.");
  b.text("faults.env", [](C& c) { return &c.faults.env; }, "The env (an envs[].name) the env faults hit (empty = every env).");
  b.enumeration("faults.env_op", [](C& c) { return &c.faults.env_op; }, "The env calls the env faults hit.");
  b.number("faults.env_exception", [](C& c) { return &c.faults.env_exception; }, 0, 1, "Probability per env call that it fails as the env's own error (env_error).");
  b.number("faults.env_crash", [](C& c) { return &c.faults.env_crash; }, 0, 1, "Probability per env call that the env worker process is SIGKILLed just before it (worker_crash; the worker is restarted). Needs a worker troupe starts: isolate: true or a remote command:.");
  b.number("faults.env_hang", [](C& c) { return &c.faults.env_hang; }, 0, 1, "Probability per env call that the worker is SIGSTOPped just before it: the call runs into envs[].timeout_s, the worker is killed and replaced (timeout). Needs a worker troupe starts.");
  b.number("faults.env_slow", [](C& c) { return &c.faults.env_slow; }, 0, 1, "Probability per env call that it starts env_slow_s late (then succeeds).");
  b.number("faults.env_drop", [](C& c) { return &c.faults.env_drop; }, 0, 1, "Probability per env call that its request is lost on the wire (never sent): the call runs into envs[].timeout_s (timeout; a worker troupe started is killed and replaced). Needs a wire: isolate: true or type remote.");
  b.number("faults.env_malformed", [](C& c) { return &c.faults.env_malformed; }, 0, 1, "Probability per env call that its reply is replaced by bytes that are not JSON before troupe parses it (protocol_error). Needs a wire: isolate: true or type remote.");
  b.number("faults.env_slow_s", [](C& c) { return &c.faults.env_slow_s; }, 0, 3600, "Delay of a slow env call, seconds.");
  b.int_list("faults.env_steps", [](C& c) { return &c.faults.env_steps; }, 1, kIntMax, "Env faults only during these GRPO steps (the metrics' step; empty = every step; an env worker's verify calls count to the step of its latest reset).");
  b.integer("faults.learner_death_step", [](C& c) { return &c.faults.learner_death_step; }, 0, kIntMax, "SIGKILL learner rank learner_death_rank as this GRPO step (the metrics' step) starts (0 = off). In one process that is the whole run; resume with --resume --set faults.learner_death_step=0.");
  b.integer("faults.learner_death_rank", [](C& c) { return &c.faults.learner_death_rank; }, 0, 4095, "The learner rank learner_death_step (or learner_death_sync) kills.");
  b.integer("faults.learner_death_sync", [](C& c) { return &c.faults.learner_death_sync; }, 0, kIntMax, "SIGKILL learner rank learner_death_rank half-way through sending its piece of this policy version's weights to the generators (weight sync from the shards: learner.shard on several learners over zmq; 0 = off). The run stops naming the rank, as for learner_death_step.");
  b.integer("faults.generator_death_step", [](C& c) { return &c.faults.generator_death_step; }, 0, kIntMax, "Generator generator_death_rank dies as it is asked to sample this GRPO step (the metrics' step; 0 = off): under mpirun its rank is SIGKILLed, in one process its actor (thread) fails. With two or more generators its prompts go to the others and the run goes on; with one the run stops with exit 3.");
  b.integer("faults.generator_death_rank", [](C& c) { return &c.faults.generator_death_rank; }, 0, 4095, "The generator (index among cluster.generators) generator_death_step kills.");
  b.integer("faults.checkpoint_interrupt_step", [](C& c) { return &c.faults.checkpoint_interrupt_step; }, 0, kIntMax, "Kill the process half-way through writing the checkpoint of this step (after its model files, before its state file and the rename; 0 = off): latest keeps pointing at the previous checkpoint.");
  b.number("faults.generator_token_s", [](C& c) { return &c.faults.generator_token_s; }, 0, 10, "Simulated sampling time: every generation (a generator's, a joined member's too) waits this many seconds per token it sampled before it replies (0 = off), as a generator slower than this machine's cores would; it sleeps, so the other roles keep the cores. For benchmarks of adding generators (troupe bench e2e, case elastic_join).");
}

std::vector<KeySpec<ExperimentConfig>> build_schema() {
  Builder<ExperimentConfig> b;
  add_run_and_policy_keys(b);
  add_training_keys(b);
  add_distill_keys(b);
  add_rollout_keys(b);
  add_cluster_keys(b);
  add_output_keys(b);
  return b.keys;
}

std::vector<KeySpec<EnvSpec>> build_env_schema() {
  Builder<EnvSpec> b;
  using E = EnvSpec;
  b.text("name", [](E& e) { return &e.name; }, "Required. Label in metrics (reward_mean/<name>, prompts/<name>); the builtin id unless env is set.");
  b.enumeration("type", [](E& e) { return &e.type; }, "builtin (compiled in), plugin (.so with the C ABI), remote (a process speaking envs/PROTOCOL.md), nemo_gym (a NeMo Gym resource server over HTTP: url or command), reasoning_gym (any reasoning-gym task: config.task, task_config, size, eval_size, seed), verifiers (a verifiers v1 environment server at address, which runs each episode and calls the policy through rollout.serve; its tasks are config.tasks or its taskset's own, config.taskset), judge (the built-in dataset env scored by an LLM judge only: config.judge, verifier none unless config names one), reward_model (the built-in dataset env's prompts, each response scored by the sequence-classification model at path: config.center, config.score_template). Without type: plugin for a path ending in .so, nemo_gym for a url, remote for a command or address, else builtin.");
  b.text("env", [](E& e) { return &e.env; }, "Builtin env id (empty = name), e.g. arithmetic, countdown.");
  b.text("path", [](E& e) { return &e.path; }, "plugin: path of the shared library; reward_model: the Hugging Face LlamaForSequenceClassification, Qwen2ForSequenceClassification or Qwen3ForSequenceClassification directory (both relative to the YAML file).");
  b.string_list("command", [](E& e) { return &e.command; }, "remote: argv that starts the env server, e.g. [python, env.py, --bind, \"{bind}\"] (empty = use address); nemo_gym: argv that starts a resource server, {port} = the port troupe picks on 127.0.0.1.");
  b.text("address", [](E& e) { return &e.address; }, "remote: address of a running env server, e.g. tcp://127.0.0.1:5555; verifiers: its env server's ZeroMQ address.");
  b.string_list("addresses", [](E& e) { return &e.addresses; }, "A pool of running env servers instead of one address (remote: tcp://HOST:PORT or ipc://PATH; nemo_gym: http://HOST:PORT; verifiers: its env servers), each serving the same env: every episode goes to the member with the fewest episodes in flight; a member whose call crashed, hung past timeout_s or lost its connection is out of the pool (its episodes fail and are retried on another member, counted in env_retries) and is probed every second until it answers again. Not with address or url.");
  b.number("weight", [](E& e) { return &e.weight; }, 0, 1e6, "Share of prompts drawn from this env (normalized over envs).");
  b.number("timeout_s", [](E& e) { return &e.timeout_s; }, 0.001, 86400, "Per-call timeout (reset/step/verify); a late call fails the episode.");
  b.enumeration("isolate", [](E& e) { return &e.isolate; }, "Run a builtin/plugin env in its own worker process (crash and hang isolation); auto = plugins only.");
  b.mapping("config", [](E& e) { return &e.config; }, "Env-specific settings, passed to the env as is (e.g. difficulty); the dataset env's relative train/eval paths, its reward hook's file or module (verifier: python) and base_dir start at the YAML file's folder; in a remote env's config each string that is a relative path naming an existing file or folder there is made absolute.");
  b.number("startup_timeout_s", [](E& e) { return &e.startup_timeout_s; }, 0.001, 86400, "A worker or server troupe starts must answer hello within this.");
  b.integer("max_restarts", [](E& e) { return &e.max_restarts; }, 0, kIntMax, "Env worker restarts (after a crash, hang or malformed reply) per run; one more stops the run (exit 3).");
  b.integer("max_message_bytes", [](E& e) { return &e.max_message_bytes; }, 1024, kIntMax, "Largest env protocol message (remote, isolated worker, verifiers) a troupe socket accepts (a reply to troupe; a request to a worker troupe starts); a peer sending a larger one has its connection dropped by ZeroMQ without the message being read, so that call runs into timeout_s and its episode fails (timeout). nemo_gym: the largest HTTP answer read; a larger one is cut there and the call fails (protocol_error).");
  b.text("worker", [](E& e) { return &e.worker; }, "Path of the troupe-env-worker binary for isolated envs (empty = $TROUPE_ENV_WORKER, the build folder, or next to troupe).");
  b.integer("max_retries", [](E& e) { return &e.max_retries; }, 0, 1000, "A failed reset/step/verify is retried this often on the next env worker (a failed single-turn reset with a new seed, so the batch stays full).");
  b.number("max_failure_frac", [](E& e) { return &e.max_failure_frac; }, 0, 1, "Stop the run (exit 3) when more than this share of one step's episodes of this env failed after retries; a step where all failed always stops it.");
  b.number("reward_min", [](E& e) { return &e.reward_min; }, -1e300, 1e300, "Smallest valid reward; a reward below it, above reward_max or not finite fails the episode (invalid_reward).");
  b.number("reward_max", [](E& e) { return &e.reward_max; }, -1e300, 1e300, "Largest valid reward (see reward_min).");
  b.text("url", [](E& e) { return &e.url; }, "nemo_gym: root of a running NeMo Gym resource server, http://HOST:PORT (else command starts one; {port} in it is the port troupe picks).");
  b.mapping("environment", [](E& e) { return &e.environment; }, "Environment variables of the process troupe starts (a command; a verifiers env's taskset loader), NAME: value (e.g. {PYTHONPATH: ., MY_KEY: x}), on top of troupe's own environment.");
  b.text("cwd", [](E& e) { return &e.cwd; }, "Working directory of the process troupe starts (a command; a verifiers env's taskset loader; relative: to the YAML file's folder; empty = troupe's). Its stdout and stderr go to run.dir/logs/env-<name>-<pid>-<n>.log either way, kept after the run.");
  return b.keys;
}

std::string format_number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    std::ostringstream o;
    o << static_cast<long long>(v);
    return o.str();
  }
  std::ostringstream o;
  o.precision(std::numeric_limits<float>::max_digits10);
  o << v;
  std::string s = o.str();
  // keep it a YAML float
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// Shortest decimal that reads back to the same value, always a YAML float ("20.0", "1e-06").
template <class T>
std::string shortest(T v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".ein") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default: out += ch;
    }
  }
  return out + "\"";
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& config_key_aliases() {
  // The execution options moved from policy.model.* (a fresh model's architecture) to policy.*.
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"policy.model.cache_packed_metadata", "policy.cache_packed_metadata"},
      {"policy.model.activation_checkpointing", "policy.activation_checkpointing"},
      {"policy.model.offload_activations", "policy.offload_activations"},
      {"policy.model.offload_double_buffer", "policy.offload_double_buffer"},
      {"policy.model.moe_grouped", "policy.moe_grouped"},
  };
  return aliases;
}

const std::vector<KeySpec<ExperimentConfig>>& config_schema() {
  static const auto keys = build_schema();
  return keys;
}

const std::vector<KeySpec<EnvSpec>>& env_entry_schema() {
  static const auto keys = build_env_schema();
  return keys;
}

std::string type_name(KeyType t) {
  switch (t) {
    case KeyType::boolean: return "bool";
    case KeyType::integer: return "int";
    case KeyType::number: return "float";
    case KeyType::string: return "string";
    case KeyType::int_list: return "list of int";
    case KeyType::string_list: return "list of string";
    case KeyType::mapping: return "mapping";
  }
  return "?";
}

std::string render_value(const FieldRef& f) {
  struct V {
    std::string operator()(bool* p) const { return *p ? "true" : "false"; }
    std::string operator()(int* p) const { return std::to_string(*p); }
    std::string operator()(float* p) const { return shortest(*p); }
    std::string operator()(double* p) const { return shortest(*p); }
    std::string operator()(std::string* p) const { return quote(*p); }
    std::string operator()(std::vector<int>* p) const {
      std::string s = "[";
      for (size_t i = 0; i < p->size(); ++i) s += (i ? ", " : "") + std::to_string((*p)[i]);
      return s + "]";
    }
    std::string operator()(std::vector<std::string>* p) const {
      std::string s = "[";
      for (size_t i = 0; i < p->size(); ++i) s += (i ? ", " : "") + quote((*p)[i]);
      return s + "]";
    }
    std::string operator()(nlohmann::json* p) const { return p ? p->dump() : "[]"; }
    std::string operator()(const EnumRef& e) const { return quote(e.name); }
    std::string operator()(const EnumListRef& e) const {
      std::string s = "[";
      for (size_t i = 0; i < e.names.size(); ++i) s += (i ? ", " : "") + quote(e.names[i]);
      return s + "]";
    }
  };
  return std::visit(V{}, f);
}

std::string deprecated_keys_summary() {
  std::string out;
  for (const auto& [old_key, new_key] : config_key_aliases()) {
    if (!out.empty()) out += ", ";
    out += old_key + " (now " + new_key + ")";
  }
  return out;
}

// The built-in `dataset` env's `envs[].config` keys (read and checked by envs/builtin/dataset.cpp and
// dataset_rows.cpp, not by this schema; unknown keys are errors there).
std::string dataset_env_keys_table() {
  return "\nThe built-in `dataset` env (`- {name: NAME, type: builtin, env: dataset, config: {...}}`) reads these\n"
         "`envs[].config` keys (behaviour: [envs/README.md](../envs/README.md#built-in-environments), answer\n"
         "extraction and the math verifier: [docs/answers.md](../docs/answers.md)):\n\n"
         "| key | type | default | range / values | description |\n|---|---|---|---|---|\n"
         "| `envs[].config.train` | string | `\"\"` | any | Required. The train rows: a JSONL file (one JSON object a line), a `.parquet` or `.arrow` file, or a Hugging Face `datasets` directory (`save_to_disk` of a Dataset or DatasetDict, or a folder of `.arrow`/`.parquet` files as the Hub cache holds). Relative to base_dir. |\n"
         "| `envs[].config.eval` | string | `\"\"` | any | The held-out rows, in the same formats (may name the same directory as train); train rows whose prompt is also here are dropped. Empty: train rows split by a hash of each prompt (eval_fraction). |\n"
         "| `envs[].config.split` | string | `\"\"` | any | The split of a DatasetDict (or multi-split folder) train takes; empty: the only one, else `train`. An unknown split is an error listing the splits. |\n"
         "| `envs[].config.eval_split` | string | `\"\"` | any | The split eval takes; empty: the only one, else `test`. |\n"
         "| `envs[].config.max_rows` | int | `0` | 0 .. | Read at most this many rows of each file (0: all), before the train/eval split. |\n"
         "| `envs[].config.shuffle` | bool | `false` | `true`, `false` | false: a train prompt is row `seed mod N` of the N train rows (drawn with replacement; the seed is a hash of run.seed, the step and the prompt's index). true: epochs; the env's n-th draw of the run takes row perm_e[n mod N], e = n / N, perm_e a permutation from seed and e, so every row once per epoch; the coordinator numbers the draws (retries and dynamic-sampling rounds included) and checkpoints the count, so `--resume` draws on bit for bit; `data/epoch/<env>` is logged. |\n"
         "| `envs[].config.seed` | int | run.seed | any | The seed of the shuffle order. |\n"
         "| `envs[].config.template` | string | `\"{question}\"` | any | The prompt: each {field} is the row's field ({{ and }} are braces). |\n"
         "| `envs[].config.answer_field` | string | `\"answer\"` | any | The row's field holding the reference answer (a string or a number). |\n"
         "| `envs[].config.verifier` | string | `\"exact\"` | `exact`, `numeric`, `regex`, `countdown`, `math`, `python`, `none` | exact: equal strings; numeric: equal rationals; regex: the reference fully matches; countdown: rows' numbers and target; math: mathematically equal (fractions, decimals, percentages, LaTeX, expressions, sets, tuples, units); python: the function named by reward; none: no verifier, the judge alone (needs judge; the default of `type: judge`). |\n"
         "| `envs[].config.extract` | string | `\"answer_tag\"` | `answer_tag`, `last_number`, `boxed`, `gsm8k`, `regex` | Which part of a response is its answer: the last `<answer>...</answer>` else the first line; the last number; the last `\\boxed{...}`; the text after the last `####`; group 1 of pattern's last match. Other than answer_tag it is applied to a text reference too. |\n"
         "| `envs[].config.pattern` | string | `\"\"` | any | extract: regex: an ECMAScript regex with a capture group (checked when the env starts). |\n"
         "| `envs[].config.extract_reference` | bool | `true` | `true`, `false` | Apply extract to the text reference at load (a row without the answer is an error naming FILE:LINE); false: the field already is the answer. |\n"
         "| `envs[].config.reward` | string | `\"\"` | MODULE:FUNCTION | verifier: python: `FILE.py:FUNCTION` (beside the YAML) or `MODULE:FUNCTION` (importable), called as function(prompt, response, reference, row) -> float or dict (named components, summed unless it has `reward`); a missing module or function is an error at start. |\n"
         "| `envs[].config.reward_timeout_s` | float | `10` | > 0 | verifier: python: a call's deadline; past it the worker is killed and restarted and the episode fails as reward_timeout. |\n"
         "| `envs[].config.reward_workers` | int | `2` | 1 .. 64 | verifier: python: Python worker processes per env worker. |\n"
         "| `envs[].config.python` | string | $TROUPE_PYTHON or the configured one | any | The Python that runs the reward hook and reads parquet files and `datasets` directories (with pyarrow). |\n"
         "| `envs[].config.base_dir` | string | the YAML's folder | any | Folder that relative train and eval paths start at (troupe run sets it). |\n"
         "| `envs[].config.format_reward` | float | `0.0` | 0 .. 1 | Reward of a well-formed wrong answer (an answer tag; with another extract: an extracted answer). |\n"
         "| `envs[].config.eval_fraction` | float | `0.2` | 0 .. 1 | Share of train rows held out when there is no eval file. |\n"
         "| `envs[].config.judge` | mapping | none | the keys below | An LLM judge scores each completion through an OpenAI-compatible chat-completions endpoint (e.g. `troupe serve`); its score, mapped onto [0, 1], is the component `judge`. A failed call fails the episode (judge_http, judge_timeout, judge_parse), never a silent 0. |\n"
         "| `envs[].config.judge.url` | string | `\"\"` | `http://` or `https://` URL | The endpoint's base URL, e.g. `http://127.0.0.1:8000/v1` (troupe POSTs `URL/chat/completions`); a local model path is refused. Empty: model is a local model served by the scorers. |\n"
         "| `envs[].config.judge.model` | string | required | any | With url: the model name sent in each request. Without url: a model directory or .gguf served by the scorers (needs cluster.scorers >= 1, not with isolate: true); the rubric is rendered as one user turn through the model's chat template with its generation prompt when it has one (troupe validate says which), else it is the plain prompt after BOS; generations join the scorer's running batch at each decode step. |\n"
         "| `envs[].config.judge.api_key_env` | string | `\"\"` | a variable name | The environment variable holding the API key, sent as `Authorization: Bearer KEY`; unset or empty is an error at start. Empty: no key. |\n"
         "| `envs[].config.judge.rubric` | string | a 0-10 grading prompt ending `Score: N` | any | The user message: `{prompt}` (the rendered template), `{response}`, `{reference}` (the row's answer); `{{` and `}}` are braces; another `{name}` is an error at start naming it. |\n"
         "| `envs[].config.judge.parse` | string | `\"regex\"` | `regex`, `json` | How the score is read from the reply: regex: group 1 of pattern's last match; json: field of the reply's JSON object (the first `{` to the last `}` when other text surrounds it). |\n"
         "| `envs[].config.judge.pattern` | string | `Score:\\s*(-?[0-9]+(?:\\.[0-9]+)?)` | an ECMAScript regex with a group | parse: regex: group 1 is the score (a number). |\n"
         "| `envs[].config.judge.field` | string | `\"\"` | any | parse: json: the field holding the score (a number or a numeric string). Required there. |\n"
         "| `envs[].config.judge.range` | [float, float] | `[0, 10]` | lo < hi | The score's range, mapped linearly onto [0, 1]; a score outside it fails the episode as judge_parse naming the value. |\n"
         "| `envs[].config.judge.timeout_s` | float | `60` | > 0 | One call's deadline, over the whole answer (one dribbled out byte by byte too); past it the episode fails as judge_timeout. With isolate: true keep it below envs[].timeout_s. Answers over 16 MiB are cut unread (judge_http). |\n"
         "| `envs[].config.judge.max_tokens` | int | `256` | 1 .. | max_tokens of each request. |\n"
         "| `envs[].config.judge.temperature` | float | `0.0` | 0 .. 2 | temperature of each request. |\n"
         "| `envs[].config.reward_weights` | mapping | each weight 1 | {component: float} | With judge, or in a `type: reward_model` env: the reward is the weighted sum of the components `judge`, `verifier` (a built-in verifier's reward; a Python hook's own components, or `verifier` when it returns a number) and `reward_model` (the reward model's raw score), each logged as reward/<name>. A name that is no component of the env is an error at start (a hook's names: at each call, reward_bad_return). Needs judge or type: reward_model (without it a reward_model env's reward is its score alone, and config.judge and verifier: python are refused there). |\n\n"
         "Eval prompt i is row i mod N of the eval rows, in file order, shuffle or not. `troupe validate` reads every row of "
         "every dataset env and names a bad one as FILE:LINE (JSONL) or FILE:ROW (a table's row, counted from 1; "
         "`DIR[SPLIT]:ROW` in a DatasetDict).\n"
         "\nA `type: reward_model` env is the `dataset` env above (its keys; `verifier` defaults to `none`, and then a row needs no answer field) whose responses a sequence-classification model scores ([envs/README.md](../envs/README.md#a-reward-model-type-reward_model)). It also reads:\n\n"
         "| key | type | default | range / values | description |\n|---|---|---|---|---|\n"
         "| `envs[].config.center` | string | `\"none\"` | `none`, `batch`, `running` | What is subtracted from each raw score (with config.reward_weights: from each reward, the weighted sum): nothing; the mean of this env's scores in the step (its scored responses of every group); the running mean of every score of this env so far, this step's included (count and mean checkpointed, so `--resume` continues it). Never divided by a standard deviation. |\n"
         "| `envs[].config.score_template` | string | `\"chat\"` | `chat`, `plain` | How (prompt, response) reaches the model: chat: the user turn and the assistant turn through the model's chat template (no generation prompt); plain: the prompt text followed by the response. Tokenized with the model's tokenizer, no BOS/EOS added. |\n";
}

std::string render_config_readme() {
  std::ostringstream o;
  o << "# Experiment YAML reference\n\n"
       "<!-- Generated from launch/config_schema.cpp; do not edit by hand. Regenerate with\n"
       "     TROUPE_UPDATE_README=1 ctest -R launch.config_readme (the test fails when they disagree). -->\n\n"
       "Every key troupe reads, with its type, default and allowed range. Unknown keys, duplicate keys,\n"
       "tab indentation, wrong types and out-of-range values are errors (`FILE:LINE:COL: error: key: ...`,\n"
       "exit code 2) and nothing starts until the file is valid. Override any key from the command line:\n"
       "`troupe run X.yaml --set rollout.temperature=0.7 --set envs[0].weight=2`. How the sections reach\n"
       "the code (the C++ fields take these names) is in [docs/architecture.md](../docs/architecture.md).\n\n"
       "`troupe run X.yaml --resume RUN_DIR` continues the run from `RUN_DIR/checkpoints/latest` with the same\n"
       "YAML and `--set` flags (raise `grpo.max_steps` to train longer). Before it writes anything it checks\n"
       "that the checkpoint is whole (every file's size and CRC-32 against its `state.json`; if not, the error\n"
       "names the file and the earlier checkpoints that are whole, to point `latest` at) and that no key that\n"
       "changes what is trained differs from the run's `config.resolved.yaml` (the error lists each key with\n"
       "both values). A resume may change: " +
           resume_may_change_summary() +
           " (not sft.max_steps: it decides where the GRPO phase starts). Metric rows after the checkpoint's\n"
           "step are dropped and computed again. In sync mode on the same kind of CPU, a resume with the same\n"
           "config gives the metrics of an uninterrupted run bit for bit; raising grpo.max_steps keeps that\n"
           "only with a schedule that does not depend on it (optimizer.schedule: constant; cosine decays over\n"
           "max_steps).\n\n"
           "`policy.*` holds how the model runs (`policy.device` and the training optimizations), for fresh\n"
           "and loaded models alike; `policy.model.*` is only a fresh model's architecture: with `policy.path` the\n"
           "architecture is that directory's config.json, and a `policy.model` key is an error. Deprecated\n"
           "spellings still accepted, each with a warning: " + deprecated_keys_summary() + ".\n\n"
           "Example experiments in this folder (each run by a test):\n\n"
       "| file | what it runs |\n|---|---|\n"
       "| `quickstart.yaml` | tiny char-level MoE: SFT warm-up, then GRPO on the built-in `arithmetic` env |\n"
       "| `countdown.yaml` | GRPO on the built-in `countdown` env |\n"
       "| `multi_env.yaml` | two envs mixed by weight, one of them a `.so` plug-in |\n"
       "| `async.yaml` | async GRPO (generators sample v while learners train v+1, `max_staleness`) |\n"
       "| `multinode.yaml` | roles on separate ranks: `mpirun --oversubscribe -np 4` over tcp 127.0.0.1 |\n"
       "| `nemo_gym_grpo.yaml` | GRPO against NeMo Gym's `example_session_state_mgmt` resource server (`type: nemo_gym`, tool calls over HTTP) |\n"
       "| `reasoning_gym_grpo.yaml` | SFT + GRPO on a reasoning-gym task (`type: reasoning_gym`, held-out eval split) |\n"
       "| `python_reward.yaml` | SFT + GRPO on a JSONL file (`configs/data/python_reward_train.jsonl`) scored by a Python function (`python_reward.py`, the `dataset` env's `verifier: python`) |\n"
       "| `smollm2_grpo.yaml` | GRPO on SmolLM2-135M-Instruct (the GGUF setup fetches), arithmetic questions through its chat template |\n"
       "| `gsm8k_smollm2.yaml` | GRPO on raw GSM8K-format rows (`configs/data/gsm8k_style_*.jsonl`): `extract: gsm8k`, `verifier: math` |\n"
       "| `hf_model.yaml` | GRPO from a Hugging Face model directory (`policy.path`; `troupe import` makes one from a GGUF) |\n"
       "| `verifiers_grpo.yaml` | GRPO against a verifiers environment server that calls the policy through `rollout.serve` (`type: verifiers`) |\n\n"
       "## Quickstart results\n\n"
       "`troupe run configs/quickstart.yaml` (2 shared CPU cores, about 30 s per run; held-out greedy accuracy\n"
       "on 400 eval-split prompts, from `metrics.jsonl` eval rows):\n\n"
       "| seed | after SFT (step 100) | after GRPO (step 700) | gain | on an Intel Xeon VM: SFT -> GRPO (gain) |\n"
       "|---|---|---|---|---|\n"
       "| 1 | 0.302 | 0.682 | +0.38 | 0.365 -> 0.805 (+0.44) |\n"
       "| 2 | 0.550 | 0.868 | +0.32 | 0.570 -> 0.855 (+0.29) |\n"
       "| 3 | 0.335 | 0.835 | +0.50 | 0.335 -> 0.738 (+0.40) |\n\n"
       "A run is bit-identical on the same kind of CPU (any thread count); another CPU's BLAS kernels round\n"
       "differently, so its numbers differ (the first columns: a 2-vCPU AMD EPYC; the last: a 2-vCPU Xeon).\n\n"
       "CI runs a shortened version (tests/e2e, `e2e.quickstart_short`: 200 GRPO steps) and asserts that the\n"
       "training reward and the held-out accuracy rose.\n\n";
  ExperimentConfig defaults;
  std::string section;
  for (const auto& k : config_schema()) {
    std::string top = k.path.substr(0, k.path.find('.'));
    if (top != section) {
      section = top;
      o << "\n## `" << section << "`\n\n| key | type | default | range / values | description |\n|---|---|---|---|---|\n";
    }
    if (k.path == "envs") {
      o << "| `envs` | list | `[]` | entries below | " << k.description << " |\n";
      EnvSpec d;
      for (const auto& e : env_entry_schema()) {
        std::string range = "any";
        if (e.min) range = format_number(*e.min) + " .. " + format_number(*e.max);
        if (!e.choices.empty()) {
          range.clear();
          for (const auto& c : e.choices) range += (range.empty() ? "" : ", ") + ("`" + c + "`");
        }
        o << "| `envs[]." << e.path << "` | " << type_name(e.type) << " | `"
          << (e.type == KeyType::mapping ? std::string("{}") : render_value(e.field(d))) << "` | " << range << " | "
          << e.description << " |\n";
      }
      o << dataset_env_keys_table();
      continue;
    }
    std::string range = "any";
    if (k.min) range = format_number(*k.min) + " .. " + format_number(*k.max);
    if (!k.choices.empty()) {
      range.clear();
      for (const auto& c : k.choices) range += (range.empty() ? "" : ", ") + ("`" + c + "`");
    }
    if (k.type == KeyType::boolean) range = "`true`, `false`";
    o << "| `" << k.path << "` | " << type_name(k.type) << " | `" << render_value(k.field(defaults)) << "` | "
      << range << " | " << k.description << " |\n";
  }
  return o.str();
}

std::string resolved_yaml(const ExperimentConfig& cfg_in) {
  ExperimentConfig cfg = cfg_in;  // the schema's accessors take a mutable root
  std::ostringstream o;
  o << "# Resolved by troupe: every key with the value this run used (defaults and --set applied).\n";
  // A loaded model's architecture is its config.json: policy.model does not apply (and is refused).
  const bool loaded = !cfg.policy.path.empty();
  if (loaded) o << "# policy.model is left out: the architecture is policy.path's config.json.\n";
  std::vector<std::string> open;  // current nesting of mapping keys
  for (const auto& k : config_schema()) {
    if (loaded && k.path.rfind("policy.model.", 0) == 0) continue;
    std::vector<std::string> parts;
    std::stringstream ss(k.path);
    for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      o << std::string(2 * i, ' ') << parts[i] << ":\n";
      open.push_back(parts[i]);
    }
    std::string indent(2 * (parts.size() - 1), ' ');
    if (k.path == "envs") {
      if (cfg.envs.empty()) {
        o << "envs: []\n";
        continue;
      }
      o << "envs:\n";
      for (auto& e : cfg.envs) {
        bool first = true;
        for (const auto& ek : env_entry_schema()) {
          if (ek.path == "addresses" && e.addresses.empty()) continue;  // no pool: absent (an empty list is an error)
          o << (first ? "  - " : "    ") << ek.path << ": " << render_value(ek.field(e)) << "\n";
          first = false;
        }
      }
      continue;
    }
    o << indent << parts.back() << ": " << render_value(k.field(cfg)) << "\n";
  }
  return o.str();
}

namespace {
// Keys a --resume may change: where and how long the run goes, how it is placed, logged, evaluated
// and checkpointed, the optimizations that are bit-identical to the plain path, and how weights
// reach the generators (delta and full syncs carry the same values; the dtype is not resumable). (Not
// sft.max_steps: it decides where the GRPO phase starts.)
constexpr const char* kResumeMayChangePrefixes[] = {"cluster.", "checkpointing.", "logger.", "eval.", "faults."};
constexpr const char* kResumeMayChangeKeys[] = {"run.dir",
                                                "run.name",
                                                "run.max_wall_s",
                                                "run.restarts",
                                                "run.launcher",
                                                "run.restart_remaining_ranks",
                                                "grpo.max_steps",
                                                "learner.shard",
                                                "learner.optimizer_offload",
                                                "policy.cache_packed_metadata",
                                                "policy.decode_graphs",
                                                "policy.activation_checkpointing",
                                                "policy.offload_activations",
                                                "policy.offload_double_buffer",
                                                "policy.moe_grouped",
                                                "policy.moe.expert_parallel",
                                                "envs[].address",
                                                "envs[].addresses",
                                                "envs[].timeout_s",
                                                "envs[].isolate",
                                                "envs[].startup_timeout_s",
                                                "envs[].max_restarts",
                                                "envs[].max_message_bytes",
                                                "envs[].worker",
                                                "envs[].max_retries",
                                                "envs[].max_failure_frac",
                                                "weight_sync.mode",
                                                "weight_sync.full_every",
                                                "weight_sync.probe",
                                                "weight_sync.transport",
                                                "weight_sync.prepare_in_step",
                                                "weight_sync.relay_fanout",
                                                "distill.timeout_s",
                                                "distill.max_retries",
                                                "learner.memory_budget"};
bool resume_may_change(const std::string& path) {
  for (const char* p : kResumeMayChangePrefixes)
    if (path.rfind(p, 0) == 0) return true;
  for (const char* k : kResumeMayChangeKeys)
    if (path == k) return true;
  return false;
}
}  // namespace

std::string resume_may_change_summary() {
  std::string out;
  for (const char* k : kResumeMayChangeKeys) out += (out.empty() ? "" : ", ") + std::string(k);
  for (const char* p : kResumeMayChangePrefixes) out += ", " + std::string(p) + "*";
  return out;
}

std::vector<ResumeConflict> resume_conflicts(const ExperimentConfig& before_in, const ExperimentConfig& now_in) {
  ExperimentConfig before = before_in, now = now_in;  // the schema's accessors take a mutable root
  std::vector<ResumeConflict> out;
  for (const auto& k : config_schema()) {
    if (k.path == "envs") {
      if (before.envs.size() != now.envs.size()) {
        out.push_back({"envs", std::to_string(before.envs.size()) + " entries", std::to_string(now.envs.size()) + " entries"});
        continue;
      }
      for (size_t i = 0; i < now.envs.size(); ++i)
        for (const auto& ek : env_entry_schema()) {
          if (resume_may_change("envs[]." + ek.path)) continue;
          std::string a = render_value(ek.field(before.envs[i])), b = render_value(ek.field(now.envs[i]));
          if (a != b) out.push_back({"envs[" + std::to_string(i) + "]." + ek.path, a, b});
        }
      continue;
    }
    if (resume_may_change(k.path)) continue;
    std::string a = render_value(k.field(before)), b = render_value(k.field(now));
    if (a != b) out.push_back({k.path, a, b});
  }
  return out;
}

}  // namespace troupe::launch
