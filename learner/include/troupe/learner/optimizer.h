// AdamW over one flat fp32 parameter buffer (decoupled weight decay, bias correction), global-norm
// gradient clipping and the learning-rate schedule. The moments m and v mirror the parameter layout,
// so checkpointing them is two flat buffers; `step` counts completed optimizer steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/learner/config.h"

namespace troupe::learner {

// lr at optimizer step `step` (0-based): warm-up base*(step+1)/W for step < W; then constant, or
// cosine from base down to base*min_lr_ratio at total_steps (and held there).
double learning_rate_at(const OptimizerConfig& cfg, int64_t step);

// L2 norm of a flat buffer (accumulated in double, front to back).
double global_grad_norm(std::span<const float> grads);
// acc + the sum of squares of grads, added front to back in double (global_grad_norm is the root of
// add_squares(grads, 0); a buffer in consecutive pieces, each continuing the last's sum, gives the same bits).
double add_squares(std::span<const float> grads, double acc);
// The scaling of clip_grad_norm for a norm computed elsewhere (a sharded learner's global norm).
void clip_to_norm(std::span<float> grads, double norm, double max_norm);
// Scales grads so that their norm is at most max_norm (torch clip_grad_norm_: coef = max_norm/(norm+1e-6),
// applied when < 1). Returns the norm before clipping. max_norm <= 0: no clipping.
double clip_grad_norm(std::span<float> grads, double max_norm);

// Watches AdamW::step write the new parameters, each block right after its new values are written
// (while they are still in cache): the weight sync's encoder prepares its next delta there instead
// of reading every parameter again after the step. It never changes what the step computes.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Before a step over n parameters: the ranges [begin, end) the step hands over, tiling [0, n)
  // (in any order). Each range is updated on one thread, front to back, with updated() after each
  // block; ranges may run on several threads at once. Empty: the observer skips this step.
  virtual std::span<const std::pair<size_t, size_t>> begin_step(size_t n) = 0;
  // Range `range` (an index into begin_step's list): [begin, end) now hold their new values,
  // params[begin..end).
  virtual void updated(size_t range, size_t begin, size_t end, const float* params) = 0;
  // Every range is done (only after a begin_step that returned ranges).
  virtual void end_step() = 0;
};

class AdamW {
 public:
  AdamW() = default;
  explicit AdamW(size_t num_params) : m_(num_params, 0.0f), v_(num_params, 0.0f) {}
  // One update with learning rate lr: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr * wd * p; p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps), t = step + 1.
  // The update is elementwise and runs on the calling thread's OpenMP team; the values do not
  // depend on the number of threads nor on `watch`, which sees each block once it is written.
  Status step(std::span<float> params, std::span<const float> grads, const OptimizerConfig& cfg, double lr,
              StepObserver* watch = nullptr);
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
