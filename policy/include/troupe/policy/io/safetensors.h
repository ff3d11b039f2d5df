// safetensors read/write (the real format: u64 little-endian header length, JSON header of
// {name: {dtype, shape, data_offsets}} plus optional "__metadata__", then raw little-endian data).
// Every tensor comes out as fp32; every error names the tensor (where there is one) and the file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::policy::io {

// A named fp32 tensor as it travels between files and the model (row-major, C order).
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  size_t numel() const {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

using TensorMap = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

// dtypes troupe writes; reading also accepts these three and converts to fp32.
enum class DType { f32, bf16, f16 };
const char* dtype_name(DType d);  // "F32", "BF16", "F16"

std::string shape_string(const std::vector<int64_t>& shape);  // "(2, 3)"

// One entry of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as written in the file, e.g. "BF16", "I64"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// When an opened file's data section is read: all of it into memory at open (eager), or each
// tensor's bytes from the file as that tensor is read (on_demand: a reader of some tensors, such as
// one block of a model's experts, never holds the others). An on-demand file stays open (one
// descriptor, shared by the copies of the SafetensorsFile) until its last copy goes.
enum class DataLoad { eager, on_demand };

// Bytes of safetensors data sections this process has read from files so far (eager: the whole
// section at open; on demand: each range read), headers not counted. A reader's cost is the
// difference across it (policy.expert_parallel_resume_own_ranges counts a learner's resume so).
uint64_t safetensors_data_bytes_read();

// An opened safetensors file: header parsed and checked (offsets in range, sizes match
// dtype x shape), data read into memory (or on demand). Tensors are converted to fp32 on read.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path, DataLoad load = DataLoad::eager);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in file order
  const Metadata& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;

  // The tensor as fp32; errors on a missing tensor or an unsupported dtype.
  Result<Tensor> read(const std::string& name) const;
  // Same, and the shape must equal `shape` (error names tensor, file, both shapes).
  Result<Tensor> read(const std::string& name, const std::vector<int64_t>& shape) const;
  // Rows [first, first + count) of the first dimension of a tensor of shape `shape` (checked as
  // above): shape with its first dimension count; only those rows' bytes are read.
  Result<Tensor> read_rows(const std::string& name, const std::vector<int64_t>& shape, int64_t first,
                           int64_t count) const;
  // Values [first, first + out.size()) of the tensor in its row-major order, as fp32 into `out`
  // (an error names the tensor and the file when they lie past its end); only those bytes are read.
  Status read_flat(const std::string& name, size_t first, std::span<float> out) const;

 private:
  struct Descriptor;  // an on-demand file's open descriptor, closed with its last copy
  // Elements [first, first + n) of entry e, as fp32 into out (n values).
  Status read_values(const SafetensorsEntry& e, size_t first, size_t n, float* out) const;
  // On demand: bytes.size() bytes of the file from byte `at` (e names the tensor in errors).
  Status pread_all(const SafetensorsEntry& e, uint64_t at, std::vector<char>& bytes) const;
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  Metadata metadata_;
  std::shared_ptr<std::vector<char>> data_;  // the data section (after the header); null: on demand
  std::shared_ptr<const Descriptor> fd_;     // on demand: the file, open for pread(2)
  uint64_t data_start_ = 0;                  // the data section's byte offset in the file
};

// Every tensor of a file as fp32.
Result<TensorMap> read_safetensors(const std::string& path);

// Writes `tensors` (names sorted) in `dtype`; the header is padded with spaces to 8 bytes as the
// reference implementation does. Written to PATH.tmp and renamed, so a reader never sees half a file.
Status write_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {},
                         DType dtype = DType::f32);

// A checkpoint that may be one file or several shards listed by an index JSON
// (`model.safetensors.index.json`: {"weight_map": {tensor: shard file}}).
class WeightSource {
 public:
  // dir/model.safetensors, else dir/model.safetensors.index.json; an error names what is missing.
  static Result<WeightSource> open_dir(const std::string& dir, DataLoad load = DataLoad::eager);
  static Result<WeightSource> open_file(const std::string& path, DataLoad load = DataLoad::eager);
  static Result<WeightSource> open_index(const std::string& index_path, DataLoad load = DataLoad::eager);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsEntry* find(const std::string& name) const;
  std::string file_of(const std::string& name) const;  // path of the shard holding it ("" if none)
  std::string describe() const { return description_; }  // the file (or index) for messages
  Result<Tensor> read(const std::string& name) const;
  Result<Tensor> read(const std::string& name, const std::vector<int64_t>& shape) const;
  Result<Tensor> read_rows(const std::string& name, const std::vector<int64_t>& shape, int64_t first,
                           int64_t count) const;  // SafetensorsFile::read_rows
  Status read_flat(const std::string& name, size_t first, std::span<float> out) const;  // SafetensorsFile::read_flat
  Result<TensorMap> read_all() const;

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
  std::string description_;
};

// fp32 <-> 16-bit conversions (round to nearest even).
float bf16_to_float(uint16_t h);
float f16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
uint16_t float_to_f16(float f);

}  // namespace troupe::policy::io
