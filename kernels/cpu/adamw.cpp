// The optimizer ops' CPU specification (adamw.h): clip_grad_norm's norm and coefficient and
// AdamW::step's update, the same expressions in the same order, so a backend running these gives
// the learner's host optimizer bit for bit (learner.device_optimizer checks it).
#include "troupe/kernels/adamw.h"

#include <algorithm>
#include <cmath>

namespace troupe::kernels {

AdamWStep adamw_step_scalars(float b1, float b2, double lr, float weight_decay, float eps, int64_t t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t));
  return {b1, b2, static_cast<float>(lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(1.0 - lr * weight_decay), eps};
}

double add_squares(const float* g, size_t n, double acc) {
  for (size_t i = 0; i < n; ++i) acc += static_cast<double>(g[i]) * g[i];
  return acc;
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm > 0 && std::isfinite(norm)) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) return static_cast<float>(coef);
  }
  return 1.0f;
}

double grad_norm_clip(const float* g, size_t n, double max_norm, float* scale) {
  const double norm = std::sqrt(add_squares(g, n, 0.0));
  *scale = clip_coefficient(norm, max_norm);
  return norm;
}

namespace {
constexpr size_t kBlock = 4096;

void update_block(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, size_t b,
                  size_t e, const AdamWStep& k, const float* scale) {
  for (size_t i = b; i < e; ++i) {
    // clip_grad_norm scales the gradient in place only when it clips; g * 1.0f is g's bits.
    const float gi = scale ? g[i] * *scale : g[i];
    m[i] = k.b1 * m[i] + (1.0f - k.b1) * gi;
    v[i] = k.b2 * v[i] + (1.0f - k.b2) * gi * gi;
    const float denom = std::sqrt(v[i]) * k.inv_sqrt_bc2 + k.eps;
    p[i] = p[i] * k.decay - k.step_size * m[i] / denom;
  }
}
}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& k, const float* scale) {
  const auto B = static_cast<std::ptrdiff_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t blk = 0; blk < B; ++blk) {
    const size_t b = static_cast<size_t>(blk) * kBlock;
    update_block(p, g, m, v, b, std::min(n, b + kBlock), k, scale);
  }
}

}  // namespace troupe::kernels
