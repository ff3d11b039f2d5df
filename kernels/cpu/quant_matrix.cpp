// The quantized block formats on the CPU (quant_matrix.h): shape checks, fp32 -> blocks (round to
// nearest) and blocks -> fp32. Dequantization is the specification every fast path and the CUDA
// bodies are tested against; its arithmetic is ggml's, in ggml's fp32 order, so its values equal
// policy/io/gguf.cpp's bit for bit (policy.gguf_quant checks it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "quant_blocks.h"
#include "troupe/kernels/quant_matrix.h"

namespace troupe::kernels {

Status quant_check_shape(QuantFormat f, int rows, int cols) {
  const int bv = quant_block_values(f);
  const std::string shape = enum_string(f) + ": a (" + std::to_string(rows) + ", " + std::to_string(cols) + ") matrix";
  if (rows < 1 || cols < 1) return invalid_input(shape + " is empty");
  if (cols % bv != 0)
    return invalid_input(shape + ": " + std::to_string(cols) + " columns are not a multiple of the " + std::to_string(bv) +
                         "-value block");
  return {};
}

Result<QuantMatrix> quant_matrix_from_blocks(QuantFormat f, int rows, int cols, const void* blocks, size_t nbytes,
                                             std::string_view what) {
  if (Status s = quant_check_shape(f, rows, cols); !s.ok()) return invalid_input(std::string(what) + ": " + s.error().message);
  QuantMatrix m{f, rows, cols, {}};
  const size_t want = m.view().bytes();
  if (nbytes != want)
    return invalid_input(std::string(what) + ": " + std::to_string(nbytes) + " bytes of blocks, " + enum_string(f) + " (" +
                         std::to_string(rows) + ", " + std::to_string(cols) + ") needs " + std::to_string(want));
  const auto* p = static_cast<const uint8_t*>(blocks);
  m.bytes.assign(p, p + nbytes);
  return m;
}

namespace {

using quant_blocks::float_to_half;
using quant_blocks::half_to_float;

void put_half(uint8_t* p, float v) {
  const uint16_t h = float_to_half(v);
  std::memcpy(p, &h, 2);
}

void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[l]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(b, d);
  for (int l = 0; l < 32; ++l) b[2 + l] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[l] * id)));
}

void quantize_q4_0(const float* x, uint8_t* b) {
  float amax = 0, max = 0;  // max: the value of largest magnitude, with its sign
  for (int l = 0; l < 32; ++l)
    if (std::fabs(x[l]) > amax) amax = std::fabs(x[l]), max = x[l];
  const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(b, d);
  for (int l = 0; l < 16; ++l) {
    const int q0 = std::min(15, static_cast<int>(x[l] * id + 8.5f));
    const int q1 = std::min(15, static_cast<int>(x[l + 16] * id + 8.5f));
    b[2 + l] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

void quantize_q4_1(const float* x, uint8_t* b) {
  float mn = x[0], mx = x[0];
  for (int l = 1; l < 32; ++l) mn = std::min(mn, x[l]), mx = std::max(mx, x[l]);
  const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(b, d);
  put_half(b + 2, mn);
  for (int l = 0; l < 16; ++l) {
    const int q0 = std::min(15, static_cast<int>((x[l] - mn) * id + 0.5f));
    const int q1 = std::min(15, static_cast<int>((x[l + 16] - mn) * id + 0.5f));
    b[4 + l] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

// The 6-bit scale and min of sub-block j into the 12 packed bytes (the inverse of scale_min_k4).
void pack_scale_min_k4(int j, uint8_t sc, uint8_t m, uint8_t* q) {
  if (j < 4) {
    q[j] = static_cast<uint8_t>((q[j] & 0xC0) | sc);
    q[j + 4] = static_cast<uint8_t>((q[j + 4] & 0xC0) | m);
  } else {
    q[j + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
    q[j - 4] = static_cast<uint8_t>(q[j - 4] | ((sc >> 4) << 6));
    q[j] = static_cast<uint8_t>(q[j] | ((m >> 4) << 6));
  }
}

void quantize_q4_k(const float* x, uint8_t* b) {
  float scale[8], min[8], max_scale = 0, max_min = 0;
  for (int s = 0; s < 8; ++s) {
    float mn = 0, mx = x[32 * s];  // ggml keeps the min at or below zero
    for (int l = 0; l < 32; ++l) mn = std::min(mn, x[32 * s + l]), mx = std::max(mx, x[32 * s + l]);
    scale[s] = (mx - mn) / 15.0f, min[s] = -mn;
    max_scale = std::max(max_scale, scale[s]), max_min = std::max(max_min, min[s]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f, inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  put_half(b, max_scale / 63.0f);
  put_half(b + 2, max_min / 63.0f);
  uint8_t* scales = b + 4;
  std::memset(scales, 0, 12);
  const float d = half_to_float(float_to_half(max_scale / 63.0f)), dmin = half_to_float(float_to_half(max_min / 63.0f));
  uint8_t q[256];
  for (int s = 0; s < 8; ++s) {
    const auto ls = static_cast<uint8_t>(std::min(63, static_cast<int>(std::nearbyint(inv_scale * scale[s]))));
    const auto lm = static_cast<uint8_t>(std::min(63, static_cast<int>(std::nearbyint(inv_min * min[s]))));
    pack_scale_min_k4(s, ls, lm, scales);
    const float d1 = d * ls, m1 = dmin * lm;
    for (int l = 0; l < 32; ++l) {
      const int v = d1 != 0.0f ? static_cast<int>(std::nearbyint((x[32 * s + l] + m1) / d1)) : 0;
      q[32 * s + l] = static_cast<uint8_t>(std::clamp(v, 0, 15));
    }
  }
  for (int j = 0; j < 4; ++j)
    for (int l = 0; l < 32; ++l) b[16 + 32 * j + l] = static_cast<uint8_t>(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
}

void quantize_block(QuantFormat f, const float* x, uint8_t* b) {
  switch (f) {
    case QuantFormat::q8_0: return quantize_q8_0(x, b);
    case QuantFormat::q4_0: return quantize_q4_0(x, b);
    case QuantFormat::q4_1: return quantize_q4_1(x, b);
    case QuantFormat::q4_k: return quantize_q4_k(x, b);
    case QuantFormat::bf16: {
      const uint16_t h = quant_blocks::float_to_bf16(x[0]);
      std::memcpy(b, &h, 2);
      return;
    }
  }
}

}  // namespace

Result<QuantMatrix> quantize_rows(QuantFormat f, const float* w, int rows, int cols) {
  TROUPE_TRY(quant_check_shape(f, rows, cols));
  QuantMatrix m{f, rows, cols, {}};
  m.bytes.resize(m.view().bytes());
  const int bv = quant_block_values(f), bb = quant_block_bytes(f);
  const size_t blocks = static_cast<size_t>(rows) * static_cast<size_t>(cols / bv);
  for (size_t k = 0; k < blocks; ++k) quantize_block(f, w + k * bv, m.bytes.data() + k * bb);
  return m;
}

void dequantize_row_range(const QuantWeights& W, int r, int c0, int c1, float* out) {
  const auto* row = static_cast<const uint8_t*>(W.data) + static_cast<size_t>(r) * W.row_bytes();
  if (W.format == QuantFormat::bf16) {
    for (int c = c0; c < c1; ++c) out[c - c0] = quant_blocks::bf16_value(row, c);
    return;
  }
  for (int c = c0; c < c1; c += 32) quant_blocks::dequant32(W.format, row, c / 32, out + (c - c0));
}

void dequantize_rows(const QuantWeights& W, int r0, int r1, float* out) {
  for (int r = r0; r < r1; ++r) dequantize_row_range(W, r, 0, W.cols, out + static_cast<size_t>(r - r0) * W.cols);
}

}  // namespace troupe::kernels
