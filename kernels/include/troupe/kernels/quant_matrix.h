// Frozen weight matrices kept in ggml's quantized blocks (QLoRA's base weights): the formats, a
// view of a (rows, cols) matrix whose every row is cols / block_values blocks laid out byte for
// byte as in a GGUF tensor (so a GGUF tensor's bytes are used as they are), quantize / dequantize,
// and the CPU ops y = x W^T and dx += dy W that dequantize on the fly. C++17: the CUDA launchers
// include it. Dequantized values are bit for bit those of policy/io/gguf.cpp (ggml's fp32 order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/base/enum_names.h"
#include "troupe/base/result.h"

namespace troupe::kernels {

// Block layouts (little-endian; fp16 = IEEE half):
//   q8_0: 32 values in 34 bytes: fp16 d, int8 q[32];                      value = d * q
//   q4_0: 32 values in 18 bytes: fp16 d, 16 bytes of nibbles;             value = d * (q - 8)
//   q4_1: 32 values in 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles;     value = d * q + m
//         (nibble l of the 32 is byte l & 0xF for l < 16, byte l - 16 >> 4 above)
//   q4_k: 256 values in 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins of the 8
//         sub-blocks of 32, 128 bytes of nibbles (bytes 32j..32j+31 hold sub-block 2j in the low
//         nibbles and 2j+1 in the high ones); value = (d * sc) * q - dmin * m
//   bf16: 1 value in 2 bytes (the top half of the fp32 bits)
enum class QuantFormat { q8_0, q4_0, q4_1, q4_k, bf16 };

// Values per block and bytes per block of a format.
constexpr int quant_block_values(QuantFormat f) {
  return f == QuantFormat::q4_k ? 256 : f == QuantFormat::bf16 ? 1 : 32;
}
constexpr int quant_block_bytes(QuantFormat f) {
  switch (f) {
    case QuantFormat::q8_0: return 34;
    case QuantFormat::q4_0: return 18;
    case QuantFormat::q4_1: return 20;
    case QuantFormat::q4_k: return 144;
    case QuantFormat::bf16: return 2;
  }
  return 0;
}
// Bytes of one row of `cols` values (cols a multiple of quant_block_values(f)).
constexpr size_t quant_row_bytes(QuantFormat f, int cols) {
  return static_cast<size_t>(cols / quant_block_values(f)) * static_cast<size_t>(quant_block_bytes(f));
}

// A (rows, cols) matrix in blocks: row r starts at data + r * row_bytes(). `data` is host memory
// for the functions of this header and the backend's device memory for Backend's quant ops.
struct QuantWeights {
  QuantFormat format = QuantFormat::q8_0;
  int rows = 0;
  int cols = 0;
  const void* data = nullptr;
  size_t row_bytes() const { return quant_row_bytes(format, cols); }
  size_t bytes() const { return static_cast<size_t>(rows) * row_bytes(); }
};

// A host-owned quantized matrix: rows * row_bytes bytes of blocks.
struct QuantMatrix {
  QuantFormat format = QuantFormat::q8_0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> bytes;
  QuantWeights view() const { return QuantWeights{format, rows, cols, bytes.data()}; }
};

// Whether a (rows, cols) matrix can be held in `f`: rows >= 1, cols >= 1 and a multiple of the
// block; the error names the shape, the format and its block ("q4_k: a (8, 100) matrix: 100
// columns are not a multiple of the 256-value block").
Status quant_check_shape(QuantFormat f, int rows, int cols);

// A matrix from blocks already in the format's layout (a GGUF tensor's bytes): the shape is checked
// and nbytes must be rows * quant_row_bytes(f, cols); `what` prefixes the errors.
Result<QuantMatrix> quant_matrix_from_blocks(QuantFormat f, int rows, int cols, const void* blocks, size_t nbytes,
                                             std::string_view what);

// w (rows, cols) fp32 row-major -> blocks, round to nearest as ggml's reference quantizers: q8_0
// d = amax/127, q = round(x/d); q4_0 d = -max/8 (max: the value of largest magnitude), q =
// min(15, trunc(x/d + 8.5)); q4_1 d = (max - min)/15, m = min, q = min(15, trunc((x - min)/d + 0.5));
// q4_k per sub-block min(0, min x) and (max - min)/15, the 8 scales and mins rounded to 6 bits
// against the super-block's largest (63 steps), nibbles round((x + dmin*m) / (d*sc)) clamped to
// [0, 15] (no iterative scale search); bf16 round to nearest even. fp16 fields round to nearest even.
Result<QuantMatrix> quantize_rows(QuantFormat f, const float* w, int rows, int cols);

// Rows [r0, r1) of W (host memory) as fp32 into out ((r1 - r0), cols), in ggml's fp32 order.
void dequantize_rows(const QuantWeights& W, int r0, int r1, float* out);
// Columns [c0, c1) of row r (c0, c1 multiples of 32, or of 1 for bf16) into out (c1 - c0).
void dequantize_row_range(const QuantWeights& W, int r, int c0, int c1, float* out);

// ---- the CPU ops (the specification of Backend::quant_matmul_*; host memory) ----------------------
// y (T, W.rows) [assigned] = x (T, W.cols) . W^T, dequantizing W on the fly. Bit for bit
// matmul_forward(y, x, dequantized W, T, W.cols, W.rows) whenever that call takes the column-block
// or small-GEMM path (T <= 64 against a wide W, every decode step; kernels/README.md).
void quant_matmul_forward(float* y, const float* x, const QuantWeights& W, int T);
// dx (T, W.cols) [+=] dy (T, W.rows) . W. W is frozen: no weight gradient.
void quant_matmul_backward_input(float* dx, const float* dy, const QuantWeights& W, int T);

// One projection of a group that shares its input x (a layer's q, k, v or gate, up): y (T, W.rows)
// = x W^T, then, when A is set, its low-rank path y += scale (x A^T) B^T at rank r (lora_forward,
// A (r, W.cols), B (W.rows, r)); scratch holds lora_scratch_floats(T, r) floats.
struct QuantProjection {
  float* y = nullptr;
  QuantWeights W;
  const float* A = nullptr;
  const float* B = nullptr;
  float* scratch = nullptr;
  int r = 0;
  float scale = 0;
};
// The n projections' quant_matmul_forward and lora_forward calls, bit for bit. One or two tokens
// (a decode step) run every chain tile of every matrix in one OpenMP region, then the low-rank
// paths on the calling thread.
void quant_projections_forward(const QuantProjection* p, int n, const float* x, int T);

}  // namespace troupe::kernels

namespace troupe {
template <>
struct EnumNames<kernels::QuantFormat> {
  static constexpr std::pair<std::string_view, kernels::QuantFormat> table[] = {
      {"q8_0", kernels::QuantFormat::q8_0},
      {"q4_0", kernels::QuantFormat::q4_0},
      {"q4_1", kernels::QuantFormat::q4_1},
      {"q4_k", kernels::QuantFormat::q4_k},
      {"bf16", kernels::QuantFormat::bf16}};
};
}  // namespace troupe
