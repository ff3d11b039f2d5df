// Kernel bodies of rotary position embedding (rope.cu): the cos/sin tables and the rotation of
// each (x1, x2) pair, forward (sign 1) and backward (sign -1), in place allowed.
#pragma once

#include "lanes.h"

namespace troupe::kernels::cuda {

struct RopeCosSinBody {  // over N*half
  float* cos;
  float* sin;
  const int32_t* positions;
  const float* inv_freq;  // (half) or null: theta^(-2i/HD)
  int HD;
  float theta;
  TROUPE_HD void operator()(size_t j) const {
    const int half = HD / 2;
    const size_t n = j / static_cast<size_t>(half);
    const int i = static_cast<int>(j % static_cast<size_t>(half));
    const float f = inv_freq ? inv_freq[i]
                             : 1.0f / hd_pow(theta, static_cast<float>(2 * i) / static_cast<float>(HD));
    const float angle = static_cast<float>(positions[n]) * f;
    cos[j] = hd_cos(angle);
    sin[j] = hd_sin(angle);
  }
};

struct RopeRotateBody {  // over N*NH*half pairs
  float* out;
  const float* inp;
  const float* cos;
  const float* sin;
  float sign;
  int NH, HD;
  TROUPE_HD void operator()(size_t j) const {
    const int half = HD / 2;
    const size_t nh = j / static_cast<size_t>(half);
    const int i = static_cast<int>(j % static_cast<size_t>(half));
    const size_t n = nh / static_cast<size_t>(NH);
    const float c = cos[n * half + i], s = sign * sin[n * half + i];
    const float x1 = inp[nh * HD + i], x2 = inp[nh * HD + i + half];
    out[nh * HD + i] = x1 * c - x2 * s;
    out[nh * HD + i + half] = x2 * c + x1 * s;
  }
};

}  // namespace troupe::kernels::cuda
