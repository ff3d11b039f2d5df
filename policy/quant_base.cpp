// QLoRA's quantized frozen base (policy.base_dtype): the linear weights' block storage, their seeded
// init and the public accessors. Invariant: a quantized weight exists only as blocks in its backend
// buffer (never as fp32 in the arena), and nothing trains it: its input gradient is all backward forms.
#include <algorithm>

#include "model_impl.h"
#include "troupe/kernels/random.h"

namespace troupe::policy {

namespace k = troupe::kernels;

namespace {

// The block format base_dtype names (gguf: the file's own; q8_0 for values handed in as fp32).
k::QuantFormat format_of(BaseDtype d) {
  switch (d) {
    case BaseDtype::bf16: return k::QuantFormat::bf16;
    case BaseDtype::q4_k: return k::QuantFormat::q4_k;
    default: return k::QuantFormat::q8_0;
  }
}

std::string key_prefix(BaseDtype d) { return "policy.base_dtype: " + enum_string(d) + ": "; }

}  // namespace

size_t Model::Impl::add_quant_slot(const std::string& name, int rows, int cols) {
  TensorSpec t{name, {rows, cols}, 0};
  t.quantized = true;
  table.push_back(std::move(t));
  QuantSlot s;
  s.name = name;
  s.w.format = format_of(cfg.base_dtype);
  s.w.rows = rows;
  s.w.cols = cols;
  qbase.push_back(std::move(s));
  return kQuantBit | (qbase.size() - 1);
}

Status Model::Impl::check_quant_shapes() const {
  if (cfg.base_dtype == BaseDtype::gguf) return {};  // the file's blocks, checked as they are read
  for (const auto& s : qbase)
    if (Status st = k::quant_check_shape(s.w.format, s.w.rows, s.w.cols); !st.ok())
      return invalid_input(key_prefix(cfg.base_dtype) + s.name + ": " + st.error().message);
  if (!quant_base()) return {};
  const k::QuantFormat head = cfg.base_dtype == BaseDtype::bf16 ? k::QuantFormat::bf16 : k::QuantFormat::q8_0;
  if (Status st = k::quant_check_shape(head, V, C); !st.ok())
    return invalid_input(key_prefix(cfg.base_dtype) + head_name() + " (the LM head): " + st.error().message);
  return {};
}

Status Model::Impl::set_quant(size_t index, k::QuantMatrix m) {
  QuantSlot& s = qbase[index];
  if (m.rows != s.w.rows || m.cols != s.w.cols)
    return invalid_input(s.name + ": quantized blocks of a (" + std::to_string(m.rows) + ", " + std::to_string(m.cols) +
                         ") matrix, the model expects (" + std::to_string(s.w.rows) + ", " + std::to_string(s.w.cols) + ")");
  if (cfg.base_dtype != BaseDtype::gguf && m.format != s.w.format)
    return invalid_input(key_prefix(cfg.base_dtype) + s.name + ": blocks in " + enum_string(m.format) +
                         ", the base holds " + enum_string(s.w.format));
  if (m.bytes.size() != m.view().bytes())
    return invalid_input(s.name + ": " + std::to_string(m.bytes.size()) + " bytes of blocks, the shape needs " +
                         std::to_string(m.view().bytes()));
  if (s.buf.bytes() != m.bytes.size()) {
    TROUPE_ASSIGN_OR_RETURN(s.buf, be->alloc(m.bytes.size()));
  }
  be->copy_host_to_device(s.buf.data(), m.bytes.data(), m.bytes.size());
  s.w.format = m.format;
  s.w.data = s.buf.data();
  return {};
}

Status Model::Impl::init_quant(size_t index, uint64_t* stream) {
  if (cfg.base_dtype == BaseDtype::gguf) return {};  // set by the GGUF loader
  const QuantSlot& s = qbase[index];
  std::vector<float> w(static_cast<size_t>(s.w.rows) * s.w.cols);
  k::fill_normal(w.data(), w.size(), 0.02, stream);  // the draws of the fp32 init (the cpu backend's fill_normal)
  auto m = k::quantize_rows(s.w.format, w.data(), s.w.rows, s.w.cols);
  if (!m.ok()) return invalid_input(key_prefix(cfg.base_dtype) + s.name + ": " + m.error().message);
  return set_quant(index, std::move(m).value());
}

Status Model::Impl::set_head_blocks(k::QuantMatrix m) {
  const size_t n = static_cast<size_t>(V) * C;
  if (m.rows != V || m.cols != C)
    return invalid_input(head_name() + ": head blocks of a (" + std::to_string(m.rows) + ", " + std::to_string(m.cols) +
                         ") matrix, the model's head is (" + std::to_string(V) + ", " + std::to_string(C) + ")");
  std::vector<float> w(n);
  k::dequantize_rows(m.view(), 0, V, w.data());
  if (head_q.buf.bytes() != m.bytes.size()) {
    TROUPE_ASSIGN_OR_RETURN(head_q.buf, be->alloc(m.bytes.size()));
  }
  be->copy_host_to_device(head_q.buf.data(), m.bytes.data(), m.bytes.size());
  head_q.name = head_name();
  head_q.w = m.view();
  head_q.w.data = head_q.buf.data();
  // The arena's head (the embedding when tied) holds the same values, dequantized.
  if (mirrored) host_params.settle();  // no copy into the mirror is still reading the head
  be->copy_host_to_device(params.floats() + wlm, w.data(), sizeof(float) * n);
  if (mirrored) std::copy(w.begin(), w.end(), host_params.begin() + static_cast<std::ptrdiff_t>(wlm));
  return {};
}

Status Model::Impl::sync_head_quant() {
  if (!quant_base()) return {};
  const size_t n = static_cast<size_t>(V) * C;
  std::vector<float> w(n);
  if (mirrored)
    std::copy_n(host_params.begin() + static_cast<std::ptrdiff_t>(wlm), n, w.begin());
  else
    be->copy_device_to_host(w.data(), params.floats() + wlm, sizeof(float) * n);
  const k::QuantFormat f = cfg.base_dtype == BaseDtype::bf16 ? k::QuantFormat::bf16 : k::QuantFormat::q8_0;
  auto m = k::quantize_rows(f, w.data(), V, C);
  if (!m.ok()) return invalid_input(key_prefix(cfg.base_dtype) + head_name() + " (the LM head, held in " + enum_string(f) +
                                    " for sampling): " + m.error().message);
  return set_head_blocks(std::move(m).value());
}

Status Model::Impl::quant_ready() const {
  for (const auto& s : qbase)
    if (!s.w.data)
      return invalid_input(key_prefix(cfg.base_dtype) + "base tensor " + s.name +
                           " was never loaded (gguf keeps the blocks of a .gguf policy.path; a fresh model has none)");
  return {};
}

Status Model::Impl::check_trainable_base() const {
  if (!quant_base() || lora) return {};
  return invalid_input(key_prefix(cfg.base_dtype) +
                       "a quantized base is frozen: training it needs LoRA adapters (policy.lora.rank > 0), or "
                       "policy.base_dtype: fp32 for full fine-tuning");
}

// ---- public accessors -----------------------------------------------------------------------------

bool Model::base_quantized() const { return impl_->quant_base(); }

Result<k::QuantMatrix> Model::base_quant_matrix(std::string_view name) const {
  const Impl& m = *impl_;
  for (const auto& s : m.qbase) {
    if (s.name != name) continue;
    if (!s.w.data) return invalid_input(std::string(name) + ": quantized base tensor not loaded yet");
    k::QuantMatrix out{s.w.format, s.w.rows, s.w.cols, std::vector<uint8_t>(s.w.bytes())};
    m.be->copy_device_to_host(out.bytes.data(), s.w.data, out.bytes.size());
    return out;
  }
  if (m.head_q.w.data && name == m.head_q.name) {
    k::QuantMatrix out{m.head_q.w.format, m.head_q.w.rows, m.head_q.w.cols, std::vector<uint8_t>(m.head_q.w.bytes())};
    m.be->copy_device_to_host(out.bytes.data(), m.head_q.w.data, out.bytes.size());
    return out;
  }
  return invalid_input(std::string(name) + ": not a quantized base tensor");
}

Result<std::vector<float>> Model::base_tensor_values(const TensorSpec& spec) const {
  if (!spec.quantized) {
    auto p = base_params();
    if (spec.offset + spec.numel() > p.size()) return invalid_input(spec.name + ": outside the base arena");
    return std::vector<float>(p.begin() + static_cast<std::ptrdiff_t>(spec.offset),
                              p.begin() + static_cast<std::ptrdiff_t>(spec.offset + spec.numel()));
  }
  TROUPE_ASSIGN_OR_RETURN(auto q, base_quant_matrix(spec.name));
  std::vector<float> out(spec.numel());
  k::dequantize_rows(q.view(), 0, q.rows, out.data());
  return out;
}

Status Model::set_base_quant(std::string_view name, k::QuantMatrix q) {
  Impl& m = *impl_;
  for (size_t i = 0; i < m.qbase.size(); ++i)
    if (m.qbase[i].name == name) {
      ++m.params_writes;
      return m.set_quant(i, std::move(q));
    }
  if (m.quant_base() && name == m.head_name()) {  // the LM head's sampling blocks (and its fp32 values)
    ++m.params_writes;
    return m.set_head_blocks(std::move(q));
  }
  return invalid_input(std::string(name) + ": not a quantized base tensor");
}

Status Model::set_base_quant_values(std::string_view name, std::span<const float> values) {
  Impl& m = *impl_;
  for (const auto& s : m.qbase) {
    if (s.name != name) continue;
    if (values.size() != static_cast<size_t>(s.w.rows) * s.w.cols)
      return invalid_input(s.name + ": " + std::to_string(values.size()) + " values for a (" + std::to_string(s.w.rows) +
                           ", " + std::to_string(s.w.cols) + ") matrix");
    auto q = k::quantize_rows(format_of(m.cfg.base_dtype), values.data(), s.w.rows, s.w.cols);
    if (!q.ok()) return invalid_input(key_prefix(m.cfg.base_dtype) + s.name + ": " + q.error().message);
    return set_base_quant(name, std::move(q).value());
  }
  return invalid_input(std::string(name) + ": not a quantized base tensor");
}

}  // namespace troupe::policy
