// Kernel bodies of the quant ops (quant_matmul.cu): y = x W^T and dx += dy W with W in ggml blocks
// (quant_matrix.h), one block of lanes per output element, each lane decoding the W values it
// needs from their block. A value is decoded with the arithmetic of the CPU's dequantization,
// rounded per operation (no fused multiply-add), so it is the CPU's value bit for bit; the sums
// over K are the device's tree, so results match the CPU ops to rounding, not bit for bit.
#pragma once

#include <cstring>

#include "lanes.h"
#include "troupe/kernels/quant_matrix.h"

namespace troupe::kernels::cuda {

// a * b and a + b rounded once each, never contracted into an FMA (nvcc contracts by default).
TROUPE_HD inline float hd_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TROUPE_HD inline float hd_add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TROUPE_HD inline float hd_bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// IEEE half at p (little-endian) -> float, exactly.
TROUPE_HD inline float hd_half(const uint8_t* p) {
  const uint32_t h = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {
    const float v = hd_mul_rn(static_cast<float>(man), 5.9604644775390625e-8f);
    return sign ? -v : v;
  }
  if (exp == 31) return hd_bits_float(sign | 0x7F800000u | (man << 13));
  return hd_bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// The value at column c of a row of W in format f (quant_matrix.h's block layouts).
TROUPE_HD inline float quant_value(QuantFormat f, const uint8_t* row, int c) {
  const int l = c % 32;
  switch (f) {
    case QuantFormat::q8_0: {
      const uint8_t* b = row + static_cast<size_t>(c / 32) * 34;
      return hd_mul_rn(hd_half(b), static_cast<float>(static_cast<int8_t>(b[2 + l])));
    }
    case QuantFormat::q4_0: {
      const uint8_t* b = row + static_cast<size_t>(c / 32) * 18;
      const int byte = b[2 + (l & 15)], q = l < 16 ? byte & 0xF : byte >> 4;
      return hd_mul_rn(hd_half(b), static_cast<float>(q - 8));
    }
    case QuantFormat::q4_1: {
      const uint8_t* b = row + static_cast<size_t>(c / 32) * 20;
      const int byte = b[4 + (l & 15)], q = l < 16 ? byte & 0xF : byte >> 4;
      return hd_add_rn(hd_mul_rn(hd_half(b), static_cast<float>(q)), hd_half(b + 2));
    }
    case QuantFormat::q4_k: {
      const uint8_t* b = row + static_cast<size_t>(c / 256) * 144;
      const uint8_t* sc6 = b + 4;
      const int j = (c % 256) / 32;
      int sc, m;
      if (j < 4) {
        sc = sc6[j] & 63, m = sc6[j + 4] & 63;
      } else {
        sc = (sc6[j + 4] & 0xF) | ((sc6[j - 4] >> 6) << 4);
        m = (sc6[j + 4] >> 4) | ((sc6[j] >> 6) << 4);
      }
      const int byte = b[16 + 32 * (j / 2) + l], q = (j & 1) ? byte >> 4 : byte & 0xF;
      const float d1 = hd_mul_rn(hd_half(b), static_cast<float>(sc)), m1 = hd_mul_rn(hd_half(b + 2), static_cast<float>(m));
      return hd_add_rn(hd_mul_rn(d1, static_cast<float>(q)), -m1);
    }
    case QuantFormat::bf16: {
      const uint8_t* p = row + 2 * static_cast<size_t>(c);
      return hd_bits_float((static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8)) << 16);
    }
  }
  return 0.0f;
}

// y (T, N) [assigned] = x (T, K) . W^T: row r = t * N + o is one output element.
struct QuantMatmulForwardBody {
  float* y;
  const float* x;
  const uint8_t* w;
  size_t row_bytes;
  QuantFormat format;
  int N, K;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int r) const {
    const int t = r / N, o = r % N;
    const float* xt = x + static_cast<size_t>(t) * K;
    const uint8_t* wr = w + static_cast<size_t>(o) * row_bytes;
    float s = 0;
    for (int c = L.lane(); c < K; c += L.count()) s += xt[c] * quant_value(format, wr, c);
    s = L.sum(s);
    if (L.lane() == 0) y[r] = s;
  }
};

// dx (T, K) [+=] dy (T, N) . W: row r = t * K + c is one element of dx.
struct QuantMatmulBackwardInputBody {
  float* dx;
  const float* dy;
  const uint8_t* w;
  size_t row_bytes;
  QuantFormat format;
  int N, K;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int r) const {
    const int t = r / K, c = r % K;
    const float* dyt = dy + static_cast<size_t>(t) * N;
    float s = 0;
    for (int o = L.lane(); o < N; o += L.count()) s += dyt[o] * quant_value(format, w + static_cast<size_t>(o) * row_bytes, c);
    s = L.sum(s);
    if (L.lane() == 0) dx[r] += s;
  }
};

}  // namespace troupe::kernels::cuda
