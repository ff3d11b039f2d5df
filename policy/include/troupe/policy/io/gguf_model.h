// A .gguf file straight into a Model whose base keeps the file's quantized blocks (policy.base_dtype:
// gguf; policy/README.md "QLoRA"): projections as kernels::QuantMatrix, no fp32 copy of them.
// Errors name the file and the tensor.
#pragma once

#include <string>

#include "troupe/base/result.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/model.h"

namespace troupe::policy::io {

// The model of `meta` (config.json of the .gguf's import, read without weights) with every tensor
// from gguf_path: exec.base_dtype must be gguf; q/k of a llama GGUF un-permuted (unpermute_qk_rows);
// F32/F16/Q5_K/Q6_K projections requantized into q8_0 (read_quant_matrix).
Result<Model> model_from_gguf(const std::string& gguf_path, const ModelDir& meta, const ExecutionOptions& exec);

}  // namespace troupe::policy::io
