// Kernel bodies of RMSNorm (rmsnorm.cu): forward and the input gradient one block per row (a block
// sum of squares / of w*dy*x), the weight gradient one thread per channel walking the rows in order.
#pragma once

#include "lanes.h"

namespace troupe::kernels::cuda {

struct RmsnormForwardBody {
  float* out;
  float* rstd;
  const float* inp;
  const float* weight;
  int C;
  float eps;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int n) const {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* y = out + static_cast<size_t>(n) * C;
    float ss = 0;
    for (int c = L.lane(); c < C; c += L.count()) ss += x[c] * x[c];
    ss = L.sum(ss);
    const float r = 1.0f / hd_sqrt(ss / static_cast<float>(C) + eps);
    if (L.lane() == 0) rstd[n] = r;
    for (int c = L.lane(); c < C; c += L.count()) y[c] = x[c] * r * weight[c];
  }
};

struct RmsnormBackwardBody {  // dinp += ... (must not alias dout)
  float* dinp;
  const float* dout;
  const float* inp;
  const float* weight;
  const float* rstd;
  int C;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int n) const {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* dy = dout + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float r = rstd[n];
    float s = 0;
    for (int c = L.lane(); c < C; c += L.count()) s += weight[c] * dy[c] * x[c];
    s = L.sum(s);
    const float k = r * r * r * s / static_cast<float>(C);
    for (int c = L.lane(); c < C; c += L.count()) dx[c] += r * weight[c] * dy[c] - k * x[c];
  }
};

struct RmsnormDweightBody {  // over C channels: dweight[c] += sum_n dy x rstd
  float* dweight;
  const float* dout;
  const float* inp;
  const float* rstd;
  int N, C;
  TROUPE_HD void operator()(size_t c) const {
    float acc = 0;
    for (int n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(n) * C + c;
      acc += dout[i] * inp[i] * rstd[n];
    }
    dweight[c] += acc;
  }
};

}  // namespace troupe::kernels::cuda
