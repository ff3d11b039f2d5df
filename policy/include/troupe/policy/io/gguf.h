// GGUF reader (the llama.cpp / ggml file format, versions 2 and 3): header, metadata key/values of
// every type, tensor infos, alignment and data offsets, all bounds-checked at open; tensors come
// out as fp32, dequantized from F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K
// (policy/io/README.md, "GGUF"). Every error names the file and what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/policy/io/safetensors.h"

namespace troupe::policy::io {

// Metadata value types, numbered as in the file.
enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9, u64 = 10,
  i64 = 11, f64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);  // "uint32", "string", "array", ...

// One metadata value. Integers are held in `i` (signed types and unsigned up to 2^63) and `u`
// (all unsigned types); floats in `f`; arrays keep their element type and elements.
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  GgufValueType elem_type = GgufValueType::u8;  // arrays only
  std::vector<GgufValue> array;
  bool is_integer() const;
  bool is_float() const { return type == GgufValueType::f32 || type == GgufValueType::f64; }
};

// ggml tensor types troupe names in messages; the numbers are those of the file.
namespace ggml_type {
constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10,
                   Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30;
}
std::string ggml_type_name(uint32_t type);  // "Q4_K", or "type 23" for one troupe does not know
bool ggml_type_supported(uint32_t type);    // dequantized by GgufFile::read

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the fastest-varying (contiguous) dimension
  uint32_t type = 0;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;  // 0 when the type's block size is unknown
  // Row-major (C order) shape: ne reversed, e.g. a (rows, cols) matrix has ne = {cols, rows}.
  std::vector<int64_t> shape() const;
  int64_t numel() const;
};

class GgufFile {
 public:
  // Reads and checks the whole file: magic, version (2 or 3), counts, every string and array
  // inside the file, alignment a power of two, each tensor's byte range inside the data section.
  static Result<GgufFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // in file order
  const GgufTensorInfo* find(const std::string& name) const;

  const GgufValue* get(const std::string& key) const;  // null if absent
  // Typed getters: errors name the file and the key (missing, or of another type).
  Result<int64_t> get_int(const std::string& key) const;
  Result<double> get_float(const std::string& key) const;  // accepts integer values too
  Result<std::string> get_string(const std::string& key) const;
  Result<bool> get_bool(const std::string& key) const;
  Result<std::vector<std::string>> get_strings(const std::string& key) const;
  Result<std::vector<double>> get_floats(const std::string& key) const;  // float or integer arrays
  Result<std::vector<int64_t>> get_ints(const std::string& key) const;

  // The tensor as fp32 in row-major shape(); an unsupported type is an error naming it and the tensor.
  Result<Tensor> read(const std::string& name) const;
  // The tensor's bytes as stored (t.nbytes of them; t one of tensors()), valid while this file lives.
  const uint8_t* tensor_data(const GgufTensorInfo& t) const { return bytes_->data() + data_start_ + t.offset; }

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::shared_ptr<std::vector<uint8_t>> bytes_;  // the whole file
  uint64_t data_start_ = 0;
};

// Dequantizes n values of `type` from `data` (nbytes long) into out[0..n); errors name `what`.
Status ggml_dequantize(uint32_t type, const uint8_t* data, uint64_t nbytes, int64_t n, float* out,
                       const std::string& what);

}  // namespace troupe::policy::io
