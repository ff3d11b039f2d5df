// AdamW over one flat fp32 parameter buffer (decoupled weight decay, bias correction), global-norm
// gradient clipping and the learning-rate schedule. The moments m and v mirror the parameter layout,
// so checkpointing them is two flat buffers; `step` counts completed optimizer steps.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/learner/config.h"

namespace troupe::learner {

// lr at optimizer step `step` (0-based): warm-up base*(step+1)/W for step < W; then constant, or
// cosine from base down to base*min_lr_ratio at total_steps (and held there).
double learning_rate_at(const OptimizerConfig& cfg, int64_t step);

// L2 norm of a flat buffer (accumulated in double).
double global_grad_norm(std::span<const float> grads);
// Scales grads so that their norm is at most max_norm (torch clip_grad_norm_: coef = max_norm/(norm+1e-6),
// applied when < 1). Returns the norm before clipping. max_norm <= 0: no clipping.
double clip_grad_norm(std::span<float> grads, double max_norm);

class AdamW {
 public:
  AdamW() = default;
  explicit AdamW(size_t num_params) : m_(num_params, 0.0f), v_(num_params, 0.0f) {}
  // One update with learning rate lr: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr * wd * p; p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps), t = step + 1.
  Status step(std::span<float> params, std::span<const float> grads, const OptimizerConfig& cfg, double lr);
  int64_t steps() const { return step_; }
  std::span<float> exp_avg() { return m_; }
  std::span<float> exp_avg_sq() { return v_; }
  std::span<const float> exp_avg() const { return m_; }
  std::span<const float> exp_avg_sq() const { return v_; }
  void set_steps(int64_t s) { step_ = s; }
  size_t size() const { return m_.size(); }

 private:
  std::vector<float> m_;  // (P) first moment
  std::vector<float> v_;  // (P) second moment
  int64_t step_ = 0;
};

}  // namespace troupe::learner
