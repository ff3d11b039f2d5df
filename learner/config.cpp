// Validation of a LearnerConfig: ranges and combinations. Every error names the field (as the
// experiment YAML names it) and the value.
#include "troupe/learner/config.h"

#include <string>
#include <tuple>

namespace troupe::learner {

Status validate(const LearnerConfig& c) {
  auto err = [](const std::string& m) { return invalid_input("learner: " + m); };
  if (c.loss.clip_low < 0 || c.loss.clip_low >= 1) return err("clip_low must be in [0, 1), got " + std::to_string(c.loss.clip_low));
  if (c.loss.clip_high < 0) return err("clip_high must be >= 0, got " + std::to_string(c.loss.clip_high));
  if (c.loss.kl_coef < 0) return err("kl_coef must be >= 0, got " + std::to_string(c.loss.kl_coef));
  if (c.loss.dual_clip != 0 && c.loss.dual_clip <= 1) return err("dual_clip must be > 1 (or 0 = off)");
  if (c.loss.two_sided_clip != 0 && c.loss.two_sided_clip <= 1 + c.loss.clip_high)
    return err("two_sided_clip must be > 1 + clip_high (or 0 = off)");
  if (c.loss.agg_mode == LossAggMode::seq_mean_token_sum_norm && c.loss.agg_norm_length <= 0 &&
      c.max_completion_length <= 0)
    return err("seq-mean-token-sum-norm needs agg_norm_length > 0 or max_completion_length > 0");
  const auto& l = c.loss;
  if (!(l.tis_cap > 0)) return err("tis_cap must be > 0, got " + std::to_string(l.tis_cap));
  for (const auto& [lo, hi, name] : {std::tuple{l.mis_low, l.mis_high, "mis"},
                                     std::tuple{l.geo_mask_low, l.geo_mask_high, "geo_mask"},
                                     std::tuple{l.icepop_low, l.icepop_high, "icepop"}})
    if (!(lo >= 0) || !(hi > lo))
      return err(std::string(name) + "_low and " + name + "_high must satisfy 0 <= low < high, got " +
                 std::to_string(lo) + " and " + std::to_string(hi));
  if (c.advantage.std_eps < 0) return err("advantage std_eps must be >= 0");
  if (c.advantage.reward_clip < 0) return err("reward_clip must be >= 0");
  if (c.advantage.overlong_buffer_len < 0 || c.advantage.overlong_buffer_len > c.max_completion_length)
    return err("overlong_buffer_len must be in [0, max_completion_length]");
  if (c.optimizer.lr < 0) return err("lr must be >= 0");
  if (c.expert_parallel < 1)
    return err("policy.moe.expert_parallel must be >= 1, got " + std::to_string(c.expert_parallel));
  if (c.optimizer.beta1 < 0 || c.optimizer.beta1 >= 1 || c.optimizer.beta2 < 0 || c.optimizer.beta2 >= 1)
    return err("adam betas must be in [0, 1)");
  if (c.optimizer.eps <= 0) return err("eps must be > 0");
  if (c.optimizer.warmup_steps < 0) return err("warmup_steps must be >= 0");
  if (c.optimizer.schedule == LrSchedule::cosine && c.optimizer.total_steps <= 0)
    return err("the cosine schedule needs total_steps > 0");
  if (c.optimizer.min_lr_ratio < 0 || c.optimizer.min_lr_ratio > 1) return err("min_lr_ratio must be in [0, 1]");
  if (c.batch.num_mini_batches < 1) return err("num_mini_batches must be >= 1");
  if (c.batch.micro_batch_size < 0 || c.batch.micro_batch_tokens < 0)
    return err("micro_batch_size and micro_batch_tokens must be >= 0");
  if (c.batch.num_iterations < 1) return err("num_iterations must be >= 1");
  if (!(c.batch.temperature > 0)) return err("temperature must be > 0 for training log-probs");
  if (c.distill.topk < 0) return err("distill.topk must be >= 0, got " + std::to_string(c.distill.topk));
  if (!(c.distill.coef >= 0)) return err("distill.coef must be >= 0, got " + std::to_string(c.distill.coef));
  return Status::ok_status();
}

}  // namespace troupe::learner
