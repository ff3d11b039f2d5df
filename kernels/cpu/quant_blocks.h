// Scalar decoding of ggml's blocks (internal to kernels/cpu/): fp16 and bf16 conversions and the
// 32 values of one block or K-quant sub-block, in ggml's fp32 order (mul then add, never fused),
// which is what makes quant_matrix.cpp and quant_matmul.cpp agree with policy/io/gguf.cpp bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "troupe/kernels/quant_matrix.h"

namespace troupe::kernels::quant_blocks {

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// IEEE half -> float (exact).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7F800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// float -> IEEE half, round to nearest even; overflow to infinity, NaN stays NaN.
inline uint16_t float_to_half(float f) {
  uint32_t x = float_bits(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (or inf): inf
  if (x < 0x38800000u) {  // below 2^-14: a subnormal half, round(|f| * 2^24) (exact scaling, nearest even)
    const auto m = static_cast<uint32_t>(std::nearbyint(bits_float(x) * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  x += 0xFFFu + ((x >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((x - (112u << 23)) >> 13));
}

// float -> bf16 bits, round to nearest even; NaN stays a quiet NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

inline float bf16_value(const uint8_t* row, int c) {
  uint16_t h;
  std::memcpy(&h, row + 2 * static_cast<size_t>(c), 2);
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// K-quant sub-block j's (0..7) 6-bit scale and min from the 12 packed bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63, m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// A K-quant sub-block (index s of the row's 32-value chunks): its nibble bytes, whether it takes
// the high nibbles, and its d * sc and dmin * m.
struct Q4kSub {
  const uint8_t* q;
  bool high;
  float d1, m1;
};
inline Q4kSub q4k_sub(const uint8_t* row, int s) {
  const uint8_t* b = row + static_cast<size_t>(s / 8) * 144;
  const int j = s % 8;
  uint8_t sc, m;
  scale_min_k4(j, b + 4, sc, m);
  return Q4kSub{b + 16 + 32 * (j / 2), (j & 1) != 0, load_half(b) * sc, load_half(b + 2) * m};
}

// The 32 values of chunk s (values 32s .. 32s+31) of a row of 32-value-blocked format f.
inline void dequant32(QuantFormat f, const uint8_t* row, int s, float* y) {
  switch (f) {
    case QuantFormat::q8_0: {
      const uint8_t* b = row + static_cast<size_t>(s) * 34;
      const float d = load_half(b);
      for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(static_cast<int8_t>(b[2 + l]));
      return;
    }
    case QuantFormat::q4_0: {
      const uint8_t* b = row + static_cast<size_t>(s) * 18;
      const float d = load_half(b);
      for (int l = 0; l < 16; ++l) {
        y[l] = d * static_cast<float>((b[2 + l] & 0xF) - 8);
        y[l + 16] = d * static_cast<float>((b[2 + l] >> 4) - 8);
      }
      return;
    }
    case QuantFormat::q4_1: {
      const uint8_t* b = row + static_cast<size_t>(s) * 20;
      const float d = load_half(b), m = load_half(b + 2);
      for (int l = 0; l < 16; ++l) {
        y[l] = d * static_cast<float>(b[4 + l] & 0xF) + m;
        y[l + 16] = d * static_cast<float>(b[4 + l] >> 4) + m;
      }
      return;
    }
    case QuantFormat::q4_k: {
      const Q4kSub k = q4k_sub(row, s);
      for (int l = 0; l < 32; ++l) y[l] = k.d1 * static_cast<float>(k.high ? k.q[l] >> 4 : k.q[l] & 0xF) - k.m1;
      return;
    }
    case QuantFormat::bf16:
      for (int l = 0; l < 32; ++l) y[l] = bf16_value(row, 32 * s + l);
      return;
  }
}

}  // namespace troupe::kernels::quant_blocks
