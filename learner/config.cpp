// Parsing of the user-facing option names (TRL / veRL / NeMo RL spellings) and config validation.
// Every error names the field, the value and the accepted choices.
#include "troupe/learner/config.h"

#include <string>

namespace troupe::learner {

namespace {
Error bad(const char* field, const std::string& v, const char* choices) {
  return invalid_input(std::string("learner: ") + field + " = '" + v + "' is not one of " + choices);
}
}  // namespace

Result<StdMode> parse_std_mode(const std::string& s) {
  if (s == "group" || s == "true" || s == "True") return StdMode::group;
  if (s == "batch") return StdMode::batch;
  if (s == "none" || s == "false" || s == "False") return StdMode::none;
  return bad("scale_rewards", s, "group, batch, none");
}

Result<AdvantageEstimator> parse_advantage_estimator(const std::string& s) {
  if (s == "grpo") return AdvantageEstimator::grpo;
  if (s == "rloo") return AdvantageEstimator::rloo;
  if (s == "reinforce_plus_plus" || s == "reinforce_pp" || s == "reinforce++" || s == "reinforce_plus_plus_baseline")
    return AdvantageEstimator::reinforce_pp;
  return bad("adv_estimator", s, "grpo, rloo, reinforce_plus_plus");
}

Result<KlEstimator> parse_kl_estimator(const std::string& s) {
  if (s == "k1" || s == "kl") return KlEstimator::k1;
  if (s == "k2" || s == "mse") return KlEstimator::k2;
  if (s == "k3" || s == "low_var_kl") return KlEstimator::k3;
  return bad("kl_estimator", s, "k1 (kl), k2 (mse), k3 (low_var_kl)");
}

Result<LossAggMode> parse_loss_agg_mode(const std::string& s) {
  if (s == "token-mean" || s == "dapo" || s == "bnpo") return LossAggMode::token_mean;
  if (s == "seq-mean-token-mean" || s == "grpo") return LossAggMode::seq_mean_token_mean;
  if (s == "seq-mean-token-sum") return LossAggMode::seq_mean_token_sum;
  if (s == "seq-mean-token-sum-norm" || s == "dr_grpo") return LossAggMode::seq_mean_token_sum_norm;
  return bad("loss_agg_mode", s, "token-mean (dapo), seq-mean-token-mean (grpo), seq-mean-token-sum, "
             "seq-mean-token-sum-norm (dr_grpo)");
}

Result<ImportanceSamplingLevel> parse_importance_sampling_level(const std::string& s) {
  if (s == "token") return ImportanceSamplingLevel::token;
  if (s == "sequence" || s == "gspo") return ImportanceSamplingLevel::sequence;
  return bad("importance_sampling_level", s, "token, sequence");
}

Result<LrSchedule> parse_lr_schedule(const std::string& s) {
  if (s == "constant" || s == "constant_with_warmup") return LrSchedule::constant;
  if (s == "cosine" || s == "cosine_with_min_lr") return LrSchedule::cosine;
  return bad("lr_scheduler_type", s, "constant, cosine");
}

const char* to_string(StdMode m) {
  switch (m) {
    case StdMode::group: return "group";
    case StdMode::batch: return "batch";
    case StdMode::none: return "none";
  }
  return "?";
}
const char* to_string(AdvantageEstimator e) {
  switch (e) {
    case AdvantageEstimator::grpo: return "grpo";
    case AdvantageEstimator::rloo: return "rloo";
    case AdvantageEstimator::reinforce_pp: return "reinforce_plus_plus";
  }
  return "?";
}
const char* to_string(KlEstimator k) {
  switch (k) {
    case KlEstimator::k1: return "k1";
    case KlEstimator::k2: return "k2";
    case KlEstimator::k3: return "k3";
  }
  return "?";
}
const char* to_string(LossAggMode m) {
  switch (m) {
    case LossAggMode::token_mean: return "token-mean";
    case LossAggMode::seq_mean_token_mean: return "seq-mean-token-mean";
    case LossAggMode::seq_mean_token_sum: return "seq-mean-token-sum";
    case LossAggMode::seq_mean_token_sum_norm: return "seq-mean-token-sum-norm";
  }
  return "?";
}

Status validate(const LearnerConfig& c) {
  auto err = [](const std::string& m) { return invalid_input("learner: " + m); };
  if (c.loss.epsilon < 0 || c.loss.epsilon >= 1) return err("epsilon must be in [0, 1), got " + std::to_string(c.loss.epsilon));
  if (c.loss.beta < 0) return err("beta must be >= 0, got " + std::to_string(c.loss.beta));
  if (c.loss.clip_ratio_c != 0 && c.loss.clip_ratio_c <= 1) return err("clip_ratio_c must be > 1 (or 0 = off)");
  if (c.loss.delta != 0 && c.loss.delta <= 1 + c.loss.eps_high()) return err("delta must be > 1 + epsilon_high (or 0 = off)");
  if (c.loss.loss_agg_mode == LossAggMode::seq_mean_token_sum_norm && c.loss.loss_scale_factor <= 0 &&
      c.max_completion_length <= 0)
    return err("seq-mean-token-sum-norm needs loss_scale_factor > 0 or max_completion_length > 0");
  if (c.advantage.epsilon_std < 0) return err("advantage epsilon must be >= 0");
  if (c.advantage.reward_clip < 0) return err("reward_clip must be >= 0");
  if (c.advantage.overlong_buffer_len < 0 || c.advantage.overlong_buffer_len > c.max_completion_length)
    return err("overlong_buffer_len must be in [0, max_completion_length]");
  if (c.optimizer.learning_rate < 0) return err("learning_rate must be >= 0");
  if (c.optimizer.beta1 < 0 || c.optimizer.beta1 >= 1 || c.optimizer.beta2 < 0 || c.optimizer.beta2 >= 1)
    return err("adam betas must be in [0, 1)");
  if (c.optimizer.adam_epsilon <= 0) return err("adam_epsilon must be > 0");
  if (c.optimizer.warmup_steps < 0) return err("warmup_steps must be >= 0");
  if (c.optimizer.lr_scheduler_type == LrSchedule::cosine && c.optimizer.total_steps <= 0)
    return err("the cosine schedule needs total_steps > 0");
  if (c.optimizer.min_lr_ratio < 0 || c.optimizer.min_lr_ratio > 1) return err("min_lr_ratio must be in [0, 1]");
  if (c.batch.num_mini_batches < 1) return err("num_mini_batches must be >= 1");
  if (c.batch.micro_batch_size < 0 || c.batch.max_tokens_per_micro_batch < 0)
    return err("micro_batch_size and max_tokens_per_micro_batch must be >= 0");
  if (c.batch.num_iterations < 1) return err("num_iterations must be >= 1");
  if (!(c.batch.temperature > 0)) return err("temperature must be > 0 for training log-probs");
  return Status::ok_status();
}

}  // namespace troupe::learner
