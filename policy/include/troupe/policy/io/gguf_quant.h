// A GGUF tensor as a kernels::QuantMatrix (QLoRA's frozen base weights), with no fp32 copy: Q8_0,
// Q4_0, Q4_1, Q4_K and BF16 tensors keep their blocks byte for byte; F32, F16, Q5_K and Q6_K are
// dequantized and requantized into a fallback format. Every error names the file and the tensor.
#pragma once

#include <optional>
#include <string>

#include "troupe/base/result.h"
#include "troupe/kernels/quant_matrix.h"
#include "troupe/policy/io/gguf.h"

namespace troupe::policy::io {

// The QuantFormat whose blocks are those of ggml type `type` (Q8_0, Q4_0, Q4_1, Q4_K, BF16), if any.
std::optional<kernels::QuantFormat> quant_format_of_ggml(uint32_t type);

// Tensor `name` of `file`, a matrix (ne = {cols, rows}; shape() (rows, cols)), in blocks. A type
// with a QuantFormat is copied as stored; F32, F16, Q5_K and Q6_K are dequantized (GgufFile::read)
// and quantized into `fallback` (round to nearest, quantize_rows). Errors: no such tensor, not two
// dimensions, a type troupe cannot read (naming it), a row length the fallback's block does not
// divide (naming the shape).
Result<kernels::QuantMatrix> read_quant_matrix(const GgufFile& file, const std::string& name,
                                               kernels::QuantFormat fallback = kernels::QuantFormat::q8_0);

// unpermute_qk (gguf_import.h) on a quantized matrix: llama's q/k rows back from interleaved rotary
// pairs to HF's halves, moving whole rows of blocks (a row's values never mix with another's).
Result<kernels::QuantMatrix> unpermute_qk_rows(const kernels::QuantMatrix& m, int64_t heads, const std::string& what);

}  // namespace troupe::policy::io
