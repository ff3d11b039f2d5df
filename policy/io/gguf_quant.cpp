// GGUF tensors as quantized matrices (gguf_quant.h): the stored blocks of the ggml types whose
// layout kernels::QuantFormat shares are copied as they are, so their dequantized values are
// GgufFile::read's bit for bit; other readable types go through fp32 into the fallback format.
#include "troupe/policy/io/gguf_quant.h"

#include <algorithm>
#include <limits>

namespace troupe::policy::io {

std::optional<kernels::QuantFormat> quant_format_of_ggml(uint32_t type) {
  switch (type) {
    case ggml_type::Q8_0: return kernels::QuantFormat::q8_0;
    case ggml_type::Q4_0: return kernels::QuantFormat::q4_0;
    case ggml_type::Q4_1: return kernels::QuantFormat::q4_1;
    case ggml_type::Q4_K: return kernels::QuantFormat::q4_k;
    case ggml_type::BF16: return kernels::QuantFormat::bf16;
    default: return std::nullopt;
  }
}

Result<kernels::QuantMatrix> read_quant_matrix(const GgufFile& file, const std::string& name, kernels::QuantFormat fallback) {
  const std::string what = file.path() + ": tensor '" + name + "'";
  const GgufTensorInfo* t = file.find(name);
  if (!t) return invalid_input(file.path() + ": no tensor '" + name + "'");
  if (t->ne.size() != 2)
    return invalid_input(what + " has " + std::to_string(t->ne.size()) + " dimensions; a quantized matrix needs 2");
  if (t->ne[0] > std::numeric_limits<int>::max() || t->ne[1] > std::numeric_limits<int>::max())
    return invalid_input(what + " is too large for a quantized matrix");
  const int rows = static_cast<int>(t->ne[1]), cols = static_cast<int>(t->ne[0]);
  if (const auto f = quant_format_of_ggml(t->type))
    return kernels::quant_matrix_from_blocks(*f, rows, cols, file.tensor_data(*t), t->nbytes, what);
  if (!ggml_type_supported(t->type))
    return invalid_input(what + ": tensor type " + ggml_type_name(t->type) +
                         " cannot be held quantized (troupe keeps Q8_0, Q4_0, Q4_1, Q4_K and BF16 blocks and requantizes "
                         "F32, F16, Q5_K and Q6_K)");
  TROUPE_ASSIGN_OR_RETURN(Tensor dense, file.read(name));
  auto m = kernels::quantize_rows(fallback, dense.data.data(), rows, cols);
  if (!m.ok())
    return invalid_input(what + " (" + ggml_type_name(t->type) + ") cannot be requantized: " + m.error().message);
  return m;
}

Result<kernels::QuantMatrix> unpermute_qk_rows(const kernels::QuantMatrix& m, int64_t heads, const std::string& what) {
  if (heads <= 0 || m.rows % heads != 0 || (m.rows / heads) % 2 != 0)
    return invalid_input(what + ": " + std::to_string(m.rows) + " rows are not " + std::to_string(heads) +
                         " heads of an even head_dim");
  const int64_t D = m.rows / heads;
  const size_t rb = m.view().row_bytes();
  kernels::QuantMatrix out{m.format, m.rows, m.cols, std::vector<uint8_t>(m.bytes.size())};
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < D / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const auto src = static_cast<size_t>(h * D + 2 * i + j), dst = static_cast<size_t>(h * D + j * (D / 2) + i);
        std::copy_n(m.bytes.begin() + static_cast<std::ptrdiff_t>(src * rb), rb,
                    out.bytes.begin() + static_cast<std::ptrdiff_t>(dst * rb));
      }
  return out;
}

}  // namespace troupe::policy::io
