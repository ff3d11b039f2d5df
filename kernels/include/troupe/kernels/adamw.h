// The optimizer step as backend ops: the global gradient norm with clip_grad_norm's coefficient,
// and AdamW over one flat fp32 arena (parameters, gradients and both moments in the backend's
// memory). Invariant: the CPU functions below are the specification, operation for operation the
// learner's AdamW::step and clip_grad_norm (learner/optimizer.cpp), so a backend that runs them
// gives the host optimizer's bits; the CUDA bodies (cuda/bodies/adamw.h) compute the same update.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::kernels {

// The scalars of AdamW step t, as AdamW::step computes them (in double, rounded to float):
// step_size = lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t), decay = 1 - lr * weight_decay.
struct AdamWStep {
  float b1 = 0.9f, b2 = 0.999f, step_size = 0, inv_sqrt_bc2 = 1, decay = 1, eps = 1e-8f;
};
// The scalars of step t (1-based) with learning rate lr.
AdamWStep adamw_step_scalars(float b1, float b2, double lr, float weight_decay, float eps, int64_t t);

// CPU specification. grad_norm_clip: the L2 norm of g[0, n) (squares summed front to back in
// double, global_grad_norm's order) and, in *scale, the factor clip_grad_norm multiplies the
// gradients by: float(max_norm / (norm + 1e-6)) when that is below 1, max_norm > 0 and the norm
// finite, else 1. The gradients are not changed.
double grad_norm_clip(const float* g, size_t n, double max_norm, float* scale);
// The sum of squares behind that norm, continued from acc: acc + g[0]^2 + ... front to back in
// double (a buffer in consecutive pieces, each continuing the last's sum, gives the whole's bits:
// how sharded learners chain their shards' sums through the ranks).
double add_squares(const float* g, size_t n, double acc);
// clip_grad_norm's coefficient for a norm: float(max_norm / (norm + 1e-6)) when that is below 1,
// max_norm > 0 and the norm finite, else 1.
float clip_coefficient(double norm, double max_norm);
// AdamW over [0, n): gi = g[i] * *scale (scale null: g[i]); m = b1 m + (1-b1) gi;
// v = b2 v + (1-b2) gi gi; p = p decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps).
// Blocks of 4096 on the calling thread's OpenMP team (the values do not depend on the split).
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& k, const float* scale);

}  // namespace troupe::kernels
