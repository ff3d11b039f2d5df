// Every switch of the learner in one place: advantages, GRPO/SFT loss, optimizer, schedule,
// batching and checkpoints. Field names follow TRL's GRPOConfig / veRL's actor config so YAML maps
// 1:1 (the launcher maps `learner.*` onto these). Defaults are TRL HEAD's unless a comment says so.
#pragma once

#include <cstdint>
#include <string>

#include "troupe/base/result.h"

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

struct AdvantageConfig {
  AdvantageEstimator estimator = AdvantageEstimator::grpo;
  StdMode scale_rewards = StdMode::group;
  float epsilon_std = 1e-4f;     // added to the std (TRL 1e-4, veRL 1e-6, oat 1e-8)
  float reward_scale = 1.0f;     // r <- reward_scale * r, before clipping
  float reward_clip = 0.0f;      // > 0: r <- clamp(r, -reward_clip, reward_clip)
  bool filter_groups = false;    // DAPO dynamic sampling: drop groups whose rewards are all equal
  // DAPO soft overlong punishment (added to the reward; 0 = off). L_max = max_completion_length.
  int overlong_buffer_len = 0;          // L_cache (DAPO 4096)
  float overlong_penalty_factor = 1.0f;  // veRL `overlong_buffer.penalty_factor`
};

enum class KlEstimator {
  k1,  // logp - ref                         veRL "kl"/"k1", NeMo RL "k1"
  k2,  // (logp - ref)^2 / 2                 veRL "mse"/"k2"
  k3,  // exp(ref - logp) - (ref - logp) - 1  TRL, veRL "low_var_kl"/"k3", NeMo RL "k3"
};

enum class LossAggMode {
  token_mean,               // sum m*l / (global token count)                     DAPO, TRL "dapo", veRL default
  seq_mean_token_mean,      // mean_i [ sum_t m*l / sum_t m ]                    original GRPO, TRL "grpo"
  seq_mean_token_sum,       // mean_i [ sum_t m*l ]                              veRL "seq-mean-token-sum"
  seq_mean_token_sum_norm,  // sum m*l / (num seqs * loss_scale_factor)          Dr. GRPO, TRL "dr_grpo"
};

enum class ImportanceSamplingLevel {
  token,     // rho_t = exp(logp_t - old_t)
  sequence,  // GSPO: rho_i = exp(mean_t m(logp - old)), shared by every token of sequence i
};

struct GrpoLossConfig {
  float epsilon = 0.2f;          // eps_low  (TRL `epsilon`, veRL `clip_ratio_low`)
  float epsilon_high = -1.0f;    // eps_high (TRL `epsilon_high`, veRL `clip_ratio_high`); < 0 = epsilon
  float delta = 0.0f;            // > 0: two-sided clip, rho <- min(rho, delta) (TRL `delta`, INTELLECT-2)
  float clip_ratio_c = 0.0f;     // > 1: dual clip for A < 0, loss <= -A*c (veRL `clip_ratio_c`, 3.0 there)
  float log_ratio_clamp = 0.0f;  // > 0: clamp logp - old to +-this before exp (veRL uses 20)
  ImportanceSamplingLevel importance_sampling_level = ImportanceSamplingLevel::token;
  float beta = 0.0f;             // KL coefficient; 0 = no reference model at all
  KlEstimator kl_estimator = KlEstimator::k3;
  float kl_input_clamp = 0.0f;   // > 0: clamp (ref - logp) to +-this before the estimator (NeMo RL 20)
  float kl_output_clamp = 0.0f;  // > 0: clamp the estimate to +-this (NeMo RL 10)
  float entropy_coef = 0.0f;     // entropy bonus: loss -= entropy_coef * H (veRL `entropy_coeff`)
  LossAggMode loss_agg_mode = LossAggMode::token_mean;
  float loss_scale_factor = 0.0f;  // seq-mean-token-sum-norm constant (e.g. max_completion_length); must be > 0 there
  float importance_weight_cap = 2.0f;  // samples with behavior log-probs: weight min(pi_old / pi_behavior, cap) (TIS)

  float eps_high() const { return epsilon_high < 0 ? epsilon : epsilon_high; }
};

enum class LrSchedule { constant, cosine };

struct OptimizerConfig {
  float learning_rate = 1e-6f;
  float beta1 = 0.9f;          // adam_beta1
  float beta2 = 0.999f;        // adam_beta2
  float adam_epsilon = 1e-8f;
  float weight_decay = 0.0f;   // decoupled (AdamW); veRL uses 0.01
  float max_grad_norm = 1.0f;  // <= 0: no clipping (the norm is still reported)
  LrSchedule lr_scheduler_type = LrSchedule::constant;
  int warmup_steps = 0;        // linear warm-up over this many optimizer steps
  int total_steps = 0;         // for cosine: optimizer steps until the minimum
  float min_lr_ratio = 0.0f;   // cosine floor as a fraction of learning_rate
};

enum class Phase { grpo, sft };

struct BatchConfig {
  int num_mini_batches = 1;          // optimizer steps per pass over a generation batch (steps_per_generation)
  int micro_batch_size = 0;          // sequences per micro-batch per rank (0 = whole mini-batch shard)
  int max_tokens_per_micro_batch = 0;  // > 0: dynamic batching by token budget (overrides micro_batch_size)
  int num_iterations = 1;            // PPO epochs over one generation batch (TRL `num_iterations`, mu)
  float temperature = 1.0f;          // sampling temperature; logits are divided by it
  bool mask_truncated_completions = false;  // zero the loss of completions that did not reach EOS
  bool shuffle = false;              // shuffle the generation batch before each pass (TRL does)
};

// The whole learner configuration (YAML section `learner`).
struct LearnerConfig {
  Phase phase = Phase::grpo;
  AdvantageConfig advantage;
  GrpoLossConfig loss;
  OptimizerConfig optimizer;
  BatchConfig batch;
  int max_completion_length = 512;  // L_max: overlong penalty, default loss_scale_factor
  uint64_t seed = 0;                // seeds the trainer's shuffling RNG (saved in checkpoints)
};

// Names as users write them in YAML ("token-mean", "k3", "group", ...). Errors name the value and the choices.
Result<StdMode> parse_std_mode(const std::string& s);  // group|batch|none (also true/false)
Result<AdvantageEstimator> parse_advantage_estimator(const std::string& s);  // grpo|rloo|reinforce_plus_plus (reinforce_pp)
Result<KlEstimator> parse_kl_estimator(const std::string& s);  // k1|kl|k2|mse|k3|low_var_kl
Result<LossAggMode> parse_loss_agg_mode(const std::string& s);  // token-mean|seq-mean-token-mean|... |dapo|grpo|dr_grpo
Result<ImportanceSamplingLevel> parse_importance_sampling_level(const std::string& s);  // token|sequence
Result<LrSchedule> parse_lr_schedule(const std::string& s);  // constant|cosine
const char* to_string(StdMode m);
const char* to_string(AdvantageEstimator e);
const char* to_string(KlEstimator k);
const char* to_string(LossAggMode m);

// Checks ranges and combinations (e.g. seq-mean-token-sum-norm needs loss_scale_factor > 0).
Status validate(const LearnerConfig& cfg);

}  // namespace troupe::learner
