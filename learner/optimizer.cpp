// AdamW, clipping and schedules (see optimizer.h). Moments are fp32 like the master weights;
// bias corrections are computed in double once per step.
#include "troupe/learner/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "troupe/kernels/adamw.h"

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

// (the device ops' specification, kernels/adamw.h, is the one expression of both)
double add_squares(std::span<const float> g, double acc) { return kernels::add_squares(g.data(), g.size(), acc); }

double global_grad_norm(std::span<const float> g) { return std::sqrt(add_squares(g, 0.0)); }

void clip_to_norm(std::span<float> g, double norm, double max_norm) {
  const float c = kernels::clip_coefficient(norm, max_norm);
  if (c != 1.0f)  // (x * 1.0f is x: skipping it changes no bit)
    for (float& x : g) x *= c;
}

double clip_grad_norm(std::span<float> g, double max_norm) {
  const double norm = global_grad_norm(g);
  clip_to_norm(g, norm, max_norm);
  return norm;
}

namespace {

// Parameters per block: the unit the update walks and hands to a StepObserver (in L1/L2 still).
constexpr size_t kStepBlock = 4096;

struct AdamWCoefficients {
  float b1, b2, step_size, inv_sqrt_bc2, decay, eps;
};

// The update of [b, e): the same code for every block, so the values do not depend on the split.
inline void adamw_block(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                        size_t b, size_t e, const AdamWCoefficients& k) {
  for (size_t i = b; i < e; ++i) {
    const float gi = g[i];
    m[i] = k.b1 * m[i] + (1.0f - k.b1) * gi;
    v[i] = k.b2 * v[i] + (1.0f - k.b2) * gi * gi;
    const float denom = std::sqrt(v[i]) * k.inv_sqrt_bc2 + k.eps;
    p[i] = p[i] * k.decay - k.step_size * m[i] / denom;
  }
}

}  // namespace

Status AdamW::step(std::span<float> p, std::span<const float> g, const OptimizerConfig& cfg, double lr,
                   StepObserver* watch) {
  if (p.size() != m_.size() || g.size() != m_.size())
    return invalid_input("adamw: " + std::to_string(p.size()) + " params / " + std::to_string(g.size()) +
                         " grads for an optimizer of " + std::to_string(m_.size()));
  const int64_t t = step_ + 1;
  const float b1 = cfg.beta1, b2 = cfg.beta2;
  const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t));
  const AdamWCoefficients k{b1,
                            b2,
                            static_cast<float>(lr / bc1),
                            static_cast<float>(1.0 / std::sqrt(bc2)),
                            static_cast<float>(1.0 - lr * cfg.weight_decay),
                            cfg.eps};
  float* pp = p.data();
  const float* gp = g.data();
  float* m = m_.data();
  float* v = v_.data();
  const size_t n = p.size();
  const auto ranges = watch ? watch->begin_step(n) : std::span<const std::pair<size_t, size_t>>{};
  if (!ranges.empty()) {
    const auto R = static_cast<std::ptrdiff_t>(ranges.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (std::ptrdiff_t r = 0; r < R; ++r) {
      const auto [lo, hi] = ranges[static_cast<size_t>(r)];
      for (size_t b = lo; b < hi; b += kStepBlock) {
        const size_t e = std::min(hi, b + kStepBlock);
        adamw_block(pp, gp, m, v, b, e, k);
        watch->updated(static_cast<size_t>(r), b, e, pp);
      }
    }
    watch->end_step();
  } else {
    const auto B = static_cast<std::ptrdiff_t>((n + kStepBlock - 1) / kStepBlock);
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t blk = 0; blk < B; ++blk) {
      const size_t b = static_cast<size_t>(blk) * kStepBlock;
      adamw_block(pp, gp, m, v, b, std::min(n, b + kStepBlock), k);
    }
  }
  step_ = t;
  return Status::ok_status();
}

}  // namespace troupe::learner
