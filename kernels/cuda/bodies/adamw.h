// The fused multi-tensor AdamW step over fp32 master weights on the device (one launch for every
// tensor: a table of chunks, one block per chunk), with the global gradient norm and clipping
// computed on the device too (no gradient leaves the GPU). Invariant: each element's update is the
// CPU AdamW's (learner/optimizer.cpp, adamw_block) operation for operation in fp32, every product,
// sum, quotient and square root rounded once (the device's _rn intrinsics forbid FMA contraction),
// so the results equal the CPU's bit for bit; the norm is a double sum in a fixed tree order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lanes.h"

namespace troupe::kernels::cuda {

// Rounded-once fp32 arithmetic: on the device the _rn intrinsics (never fused into an FMA), on the
// host plain operators (the project builds without FMA contraction on x86-64 baseline).
TROUPE_HD inline float rn_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TROUPE_HD inline float rn_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TROUPE_HD inline float rn_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TROUPE_HD inline float rn_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TROUPE_HD inline float rn_sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return sqrtf(a);
#endif
}

// The step's scalars, computed on the host exactly as AdamW::step computes them (in double, then
// rounded to float): step_size = lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t),
// decay = 1 - lr * weight_decay.
struct AdamWCoefficients {
  float b1, b2, step_size, inv_sqrt_bc2, decay, eps;
};

// The coefficients of step t (1-based) with learning rate lr, AdamW::step's formulas.
inline AdamWCoefficients adamw_coefficients(float b1, float b2, double lr, float weight_decay, float eps, int64_t t) {
  const double bc1 = 1.0 - pow(static_cast<double>(b1), static_cast<double>(t));
  const double bc2 = 1.0 - pow(static_cast<double>(b2), static_cast<double>(t));
  return {b1,
          b2,
          static_cast<float>(lr / bc1),
          static_cast<float>(1.0 / sqrt(bc2)),
          static_cast<float>(1.0 - lr * weight_decay),
          eps};
}

// One tensor of the step: parameters, gradients and the two moments, each n floats.
struct AdamWTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  size_t n;
};
// A block's work: elements [begin, end) of one tensor.
struct AdamWChunk {
  int tensor;
  size_t begin, end;
};

// Cuts every tensor into chunks of at most `chunk` elements (tensors of 0 elements get none).
inline std::vector<AdamWChunk> adamw_chunks(const std::vector<AdamWTensor>& tensors, size_t chunk) {
  std::vector<AdamWChunk> out;
  for (size_t t = 0; t < tensors.size(); ++t)
    for (size_t b = 0; b < tensors[t].n; b += chunk)
      out.push_back({static_cast<int>(t), b, b + chunk < tensors[t].n ? b + chunk : tensors[t].n});
  return out;
}

// One element: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g; p = p decay - step_size m / (sqrt(v)
// inv_sqrt_bc2 + eps) -- adamw_block's expression tree.
TROUPE_HD inline void adamw_element(float& p, float g, float& m, float& v, const AdamWCoefficients& k) {
  m = rn_add(rn_mul(k.b1, m), rn_mul(rn_sub(1.0f, k.b1), g));
  v = rn_add(rn_mul(k.b2, v), rn_mul(rn_mul(rn_sub(1.0f, k.b2), g), g));
  const float denom = rn_add(rn_mul(rn_sqrt(v), k.inv_sqrt_bc2), k.eps);
  p = rn_sub(rn_mul(p, k.decay), rn_div(rn_mul(k.step_size, m), denom));
}

// Row body, one row per chunk: the update of the chunk's elements. grad_scale (device, one float,
// or null) is the clipping coefficient ClipBody wrote: the gradient is multiplied by it first, as
// clip_grad_norm scales the gradients in place (by 1.0f when not clipping: the same bits).
struct AdamWBody {
  const AdamWTensor* tensors;
  const AdamWChunk* chunks;
  AdamWCoefficients k;
  const float* grad_scale;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& lanes, int c) const {
    const AdamWChunk ch = chunks[c];
    const AdamWTensor t = tensors[ch.tensor];
    const float s = grad_scale ? *grad_scale : 1.0f;
    for (size_t i = ch.begin + static_cast<size_t>(lanes.lane()); i < ch.end; i += static_cast<size_t>(lanes.count())) {
      const float g = grad_scale ? rn_mul(t.g[i], s) : t.g[i];
      adamw_element(t.p[i], g, t.m[i], t.v[i], k);
    }
  }
};

// Row body, one row per chunk: partial[c] = the chunk's sum of g^2 in double (lanes strided, then
// the block tree).
struct GradSumSqBody {
  const AdamWTensor* tensors;
  const AdamWChunk* chunks;
  double* partial;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& lanes, int c) const {
    const AdamWChunk ch = chunks[c];
    const float* g = tensors[ch.tensor].g;
    double s = 0;
    for (size_t i = ch.begin + static_cast<size_t>(lanes.lane()); i < ch.end; i += static_cast<size_t>(lanes.count()))
      s += static_cast<double>(g[i]) * g[i];
    s = lanes.sum(s);
    if (lanes.lane() == 0) partial[c] = s;
  }
};

// One row: norm = sqrt(sum of the partials); scale = clip_grad_norm's coefficient (max_norm /
// (norm + 1e-6) as float when that is below 1, max_norm > 0 and the norm finite; else 1).
struct ClipBody {
  const double* partial;
  int chunks;
  double max_norm;
  double* norm;
  float* scale;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& lanes, int) const {
    double s = 0;
    for (int c = lanes.lane(); c < chunks; c += lanes.count()) s += partial[c];
    s = lanes.sum(s);
    if (lanes.lane() != 0) return;
    const double n = hd_sqrt(s);
    *norm = n;
    float f = 1.0f;
    if (max_norm > 0 && n - n == 0) {  // (n - n == 0: finite)
      const double coef = max_norm / (n + 1e-6);
      if (coef < 1.0) f = static_cast<float>(coef);
    }
    *scale = f;
  }
};

}  // namespace troupe::kernels::cuda
