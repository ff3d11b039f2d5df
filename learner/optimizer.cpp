// AdamW, clipping and schedules (see optimizer.h). Moments are fp32 like the master weights;
// bias corrections are computed in double once per step.
#include "troupe/learner/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace troupe::learner {

double learning_rate_at(const OptimizerConfig& cfg, int64_t step) {
  const double base = cfg.lr;
  if (cfg.warmup_steps > 0 && step < cfg.warmup_steps)
    return base * static_cast<double>(step + 1) / static_cast<double>(cfg.warmup_steps);
  if (cfg.schedule == LrSchedule::constant) return base;
  const double span = std::max<int64_t>(1, cfg.total_steps - cfg.warmup_steps);
  const double p = std::clamp(static_cast<double>(step - cfg.warmup_steps) / span, 0.0, 1.0);
  const double cos_f = 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  return base * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cos_f);
}

double global_grad_norm(std::span<const float> g) {
  double ss = 0;
  for (float x : g) ss += static_cast<double>(x) * x;
  return std::sqrt(ss);
}

double clip_grad_norm(std::span<float> g, double max_norm) {
  const double norm = global_grad_norm(g);
  if (max_norm > 0 && std::isfinite(norm)) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
      for (float& x : g) x *= c;
    }
  }
  return norm;
}

Status AdamW::step(std::span<float> p, std::span<const float> g, const OptimizerConfig& cfg, double lr) {
  if (p.size() != m_.size() || g.size() != m_.size())
    return invalid_input("adamw: " + std::to_string(p.size()) + " params / " + std::to_string(g.size()) +
                         " grads for an optimizer of " + std::to_string(m_.size()));
  const int64_t t = step_ + 1;
  const float b1 = cfg.beta1, b2 = cfg.beta2;
  const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t));
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - lr * cfg.weight_decay);
  const float eps = cfg.eps;
  float* m = m_.data();
  float* v = v_.data();
  const size_t n = p.size();
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
    p[i] = p[i] * decay - step_size * m[i] / denom;
  }
  step_ = t;
  return Status::ok_status();
}

}  // namespace troupe::learner
