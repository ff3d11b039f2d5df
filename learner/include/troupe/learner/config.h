// Every switch of the learner in one place: advantages, GRPO/SFT loss, optimizer, schedule and
// batching. The fields are named as the experiment YAML names them (configs/README.md): the YAML
// sections `loss` and `optimizer` ARE GrpoLossConfig and OptimizerConfig, and `grpo` holds an
// AdvantageConfig (actors/experiment_config.h), so launch/config_schema.cpp writes these fields
// directly and the defaults below are the YAML defaults. Fields marked "no YAML key" are set from
// code (tests, benchmarks) or derived per phase by actors::learner_config. Comments name the
// TRL / veRL / NeMo RL equivalents.
#pragma once

#include <cstdint>
#include <string>

#include "troupe/base/enum_names.h"
#include "troupe/base/result.h"
#include "troupe/kernels/grpo_loss.h"

namespace troupe::learner {

// How the group-mean-centred reward is scaled (TRL `scale_rewards`, veRL `norm_adv_by_std_in_grpo`).
enum class StdMode {
  group,  // divide by the unbiased std of the group (+eps)          TRL "group", veRL True
  batch,  // divide by the unbiased std of the whole batch (+eps)      TRL "batch"
  none,   // no scaling (Dr. GRPO)                                     TRL "none", veRL False
};

enum class AdvantageEstimator {
  grpo,              // A_i = (r_i - mean_g) [/ (std + eps)]
  rloo,              // A_i = r_i - mean_{j != i} r_j  (leave-one-out baseline)
  reinforce_pp,      // REINFORCE++ baseline: A = r - mean_g, then normalised over the whole batch
};

// YAML `grpo.*` (the advantage keys).
struct AdvantageConfig {
  AdvantageEstimator adv_estimator = AdvantageEstimator::grpo;
  StdMode scale_rewards = StdMode::group;
  float reward_clip = 0.0f;       // > 0: r <- clamp(r, -reward_clip, reward_clip)
  bool dynamic_sampling = false;  // DAPO: drop groups whose rewards are all equal (veRL `filter_groups`)
  // no YAML key:
  float std_eps = 1e-4f;          // added to the std (TRL 1e-4, veRL 1e-6, oat 1e-8)
  float reward_scale = 1.0f;      // r <- reward_scale * r, before clipping
  // DAPO soft overlong punishment (added to the reward; 0 = off). L_max = max_completion_length.
  int overlong_buffer_len = 0;          // L_cache (DAPO 4096)
  float overlong_penalty_factor = 1.0f;  // veRL `overlong_buffer.penalty_factor`
};

// KL estimators (x = ref - logp): k1 = -x (veRL "kl"/"k1", NeMo RL "k1"); k2 = x^2 / 2 (veRL
// "mse"/"k2"); k3 = e^x - 1 - x (TRL, veRL "low_var_kl"/"k3", NeMo RL "k3"). The fused loss op's own enum.
using KlEstimator = kernels::KlEstimator;

enum class LossAggMode {
  token_mean,               // sum m*l / (global token count)                     DAPO, TRL "dapo", veRL default
  seq_mean_token_mean,      // mean_i [ sum_t m*l / sum_t m ]                    original GRPO, TRL "grpo"
  seq_mean_token_sum,       // mean_i [ sum_t m*l ]                              veRL "seq-mean-token-sum" (no YAML name)
  seq_mean_token_sum_norm,  // sum m*l / (num seqs * agg_norm_length)            Dr. GRPO, TRL "dr_grpo"
};

// YAML `loss.*`.
// YAML `loss.*`: the fused loss op's settings (kernels::GrpoLossParams: clip_low, clip_high,
// dual_clip, kl_coef, kl_type, kl_input_clamp, kl_output_clamp, entropy_coef, sequence_level_ratio,
// and two_sided_clip, log_ratio_clamp with no YAML key) plus how the loss is aggregated.
// Peers' names: clip_low is TRL `epsilon` / veRL `clip_ratio_low`, clip_high TRL `epsilon_high` /
// veRL `clip_ratio_high` (DAPO 0.28), dual_clip veRL `clip_ratio_c` (3.0 there), kl_coef TRL
// `beta`, the KL clamps NeMo RL's (20, 10), entropy_coef veRL `entropy_coeff`, sequence_level_ratio
// GSPO (TRL `importance_sampling_level="sequence"`), two_sided_clip TRL `delta` (INTELLECT-2),
// log_ratio_clamp veRL's 20.
// Correction of the gap between the sampler's and the learner's log-probs of the same weights
// (YAML loss.mismatch_correction). With one set, the PPO ratio is taken against the learner's own
// log-probs and each token's policy-gradient term gets a detached weight w_t of
// rho_t = pi_learner(y_t) / pi_sampler(y_t) (learner/correction.h has the formulas).
enum class MismatchCorrection {
  none,          // no weight (the sampler's log-probs are the PPO ratio's old policy)
  tis,           // w = min(rho, tis_cap)                                  truncated IS (Yao et al. 2025, veRL TIS)
  mis,           // w = rho if mis_low <= rho <= mis_high, else 0          masked IS (Liu et al. 2025)
  seq_geo_mask,  // w = 1 for every token of a sequence whose geometric-mean rho is in [geo_mask_low, geo_mask_high], else 0
  icepop,        // w = rho if icepop_low <= rho <= icepop_high, else 0    IcePop's two-sided mask M(k; alpha, beta)
};

struct GrpoLossConfig : kernels::GrpoLossParams {
  LossAggMode agg_mode = LossAggMode::token_mean;
  int agg_norm_length = 0;  // seq-mean-token-sum-norm constant (0 = max_completion_length)
  MismatchCorrection mismatch_correction = MismatchCorrection::none;
  float tis_cap = 2.0f;          // veRL's TIS cap
  float mis_low = 0.0f, mis_high = 2.0f;
  float geo_mask_low = 0.999f, geo_mask_high = 1.001f;  // veRL's geometric rejection bounds
  float icepop_low = 0.5f, icepop_high = 5.0f;          // IcePop's alpha, beta
};

enum class LrSchedule { constant, cosine };
enum class OptimizerKind { adamw };  // YAML optimizer.name

// YAML `optimizer.*`.
struct OptimizerConfig {
  OptimizerKind name = OptimizerKind::adamw;  // the only optimizer
  float lr = 1e-3f;            // peak learning rate
  float weight_decay = 0.0f;   // decoupled (AdamW); veRL uses 0.01
  float beta1 = 0.9f;          // adam_beta1
  float beta2 = 0.999f;        // adam_beta2
  float eps = 1e-8f;           // adam_epsilon
  float max_grad_norm = 1.0f;  // <= 0: no clipping (the norm is still reported)
  int warmup_steps = 0;        // linear warm-up over this many optimizer steps
  LrSchedule schedule = LrSchedule::constant;
  float min_lr_ratio = 0.0f;   // cosine floor as a fraction of lr
  // no YAML key (derived per phase):
  int total_steps = 0;         // for cosine: optimizer steps until the minimum
};

enum class Phase { grpo, sft };

// How the learner ranks split the training state (YAML learner.shard; ZeRO stages 1-3). Every stage
// computes the step of `none` bit for bit on CPU (learner/README.md, "Sharded learners").
enum class ShardStage {
  none,        // plain data parallel: every rank holds parameters, gradients and both AdamW moments
  optimizer,   // ZeRO-1: each rank holds the AdamW moments of its contiguous shard of the flat buffer
  gradients,   // ZeRO-2: and keeps only its shard of the reduced gradient (reduce-scatter)
  parameters,  // ZeRO-3: and holds only its shard of the parameters between steps
};

// No YAML section: grpo.num_iterations, grpo.micro_batch_tokens and grpo.mask_truncated are copied
// in per phase; the rest is set from code.
struct BatchConfig {
  int num_mini_batches = 1;     // optimizer steps per pass over a generation batch (steps_per_generation)
  int micro_batch_size = 0;     // sequences per micro-batch per rank (0 = whole mini-batch shard)
  int micro_batch_tokens = 0;   // > 0: dynamic batching by token budget (overrides micro_batch_size)
  int num_iterations = 1;       // PPO epochs over one generation batch (TRL `num_iterations`, mu)
  float temperature = 1.0f;     // sampling temperature; logits are divided by it
  bool mask_truncated = false;  // zero the loss of completions that did not reach EOS (TRL `mask_truncated_completions`)
  bool shuffle = false;         // shuffle the generation batch before each pass (TRL does)
};

// YAML `distill.*`: on-policy distillation from a frozen teacher served by the scorers
// (learner/README.md "On-policy distillation"). Off while `teacher` is empty.
enum class DistillKind { reverse_kl };
// The GEMM precision of the teacher's log-prob forwards on the scorers (distill.teacher_dtype).
enum class TeacherDtype { fp32, bf16 };
struct DistillConfig {
  std::string teacher;      // the teacher model (a path a scorer loads); "" = off
  float coef = 1.0f;        // A_t = coef * (log p_teacher - log p_student) per sampled token
  DistillKind kind = DistillKind::reverse_kl;
  int topk = 0;             // > 0: plus a forward-KL term over the teacher's top-k tokens per position
  float reward_coef = 0.0f; // + reward_coef * the env reward's GRPO advantage
  double timeout_s = 300;   // deadline of one scorer request (then retried on another scorer)
  int max_retries = 2;      // retries of a failed scorer request before the step fails
  TeacherDtype teacher_dtype = TeacherDtype::fp32;  // bf16: the scorers' AVX512-BF16 GEMMs (CPU)
  bool enabled() const { return !teacher.empty(); }
};

// The whole learner configuration for one phase.
struct LearnerConfig {
  Phase phase = Phase::grpo;
  AdvantageConfig advantage;
  GrpoLossConfig loss;
  OptimizerConfig optimizer;
  BatchConfig batch;
  int max_completion_length = 512;     // L_max: overlong penalty, default agg_norm_length
  float importance_weight_cap = 2.0f;  // samples with behavior log-probs: weight min(pi_old / pi_behavior, cap) (TIS)
  uint64_t seed = 0;                   // seeds the trainer's shuffling RNG (saved in checkpoints)
  ShardStage shard = ShardStage::none;  // YAML learner.shard
  // YAML learner.optimizer_offload: AdamW on the host mirror (device_optimizer.h otherwise, where
  // the model's backend is not host-visible)
  bool optimizer_offload = false;
  // YAML policy.moe.expert_parallel: the MoE experts' compute split over groups of this many
  // learner ranks (expert_parallel.h); 1 = off
  int expert_parallel = 1;
  DistillConfig distill;               // GRPO phase only (actors::learner_config leaves it off in SFT)
};

// Checks ranges and combinations (e.g. seq-mean-token-sum-norm needs agg_norm_length > 0 or
// max_completion_length > 0). Errors name the field.
Status validate(const LearnerConfig& cfg);

}  // namespace troupe::learner

namespace troupe {
template <>
struct EnumNames<learner::ShardStage> {
  using V = learner::ShardStage;
  static constexpr std::pair<std::string_view, V> table[] = {
      {"none", V::none}, {"optimizer", V::optimizer}, {"gradients", V::gradients}, {"parameters", V::parameters}};
};
template <>
struct EnumNames<learner::DistillKind> {
  using V = learner::DistillKind;
  static constexpr std::pair<std::string_view, V> table[] = {{"reverse_kl", V::reverse_kl}};
};
template <>
struct EnumNames<learner::TeacherDtype> {
  using V = learner::TeacherDtype;
  static constexpr std::pair<std::string_view, V> table[] = {{"fp32", V::fp32}, {"bf16", V::bf16}};
};
}  // namespace troupe
