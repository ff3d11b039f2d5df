// fp32 -> bf16 for the bf16 GEMMs (cuda::gemm under ComputeDtype::bf16, compute_dtype.h): the bits
// of x rounded to the nearest bf16, ties to even (the rounding of the weight-sync bf16 path and of
// PyTorch's .to(torch.bfloat16)); a NaN stays a quiet NaN, infinities stay, overflow rounds to inf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "lanes.h"

namespace troupe::kernels::cuda {

TROUPE_HD inline uint16_t hd_bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// dst (rows, cols), packed, = src (rows, cols) with leading dimension ld, as bf16 bits; one element
// per index i = r * cols + c.
struct ToBf16Body {
  uint16_t* dst;
  const float* src;
  size_t cols, ld;
  TROUPE_HD void operator()(size_t i) const {
    const size_t r = i / cols, c = i - r * cols;
    dst[i] = hd_bf16_bits(src[r * ld + c]);
  }
};

}  // namespace troupe::kernels::cuda
