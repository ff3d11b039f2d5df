// safetensors reader/writer. The header is validated completely before any tensor is used:
// offsets lie inside the data section and each byte range equals numel x dtype size, so a read
// can never run past the buffer. Multi-byte values are little-endian on disk and in memory here.
#include "troupe/policy/io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

static_assert(std::endian::native == std::endian::little, "troupe's safetensors I/O assumes a little-endian host");

namespace troupe::policy::io {
namespace fs = std::filesystem;
using nlohmann::json;

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "F32";
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / nan
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t float_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (a < 0x38800000u) {  // below the smallest normal (2^-14): subnormal or zero
    float v = std::bit_cast<float>(a) * 16777216.0f;  // in units of 2^-24, exact
    return sign | static_cast<uint16_t>(std::nearbyint(v));  // default rounding mode: ties to even
  }
  uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);  // round mantissa to 10 bits, ties to even
  return sign | static_cast<uint16_t>(((r >> 13) - (112u << 10)) & 0xffffu);
}

namespace {

size_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

Error bad(const std::string& path, const std::string& what) {
  return invalid_input(path + ": " + what);
}

std::atomic<uint64_t> g_data_bytes_read{0};

}  // namespace

uint64_t safetensors_data_bytes_read() { return g_data_bytes_read.load(std::memory_order_relaxed); }

struct SafetensorsFile::Descriptor {
  int fd = -1;
  explicit Descriptor(int f) : fd(f) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path, DataLoad load) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return bad(path, std::string("cannot open safetensors file (") + std::strerror(errno) + ")");
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8)
    return bad(path, "truncated safetensors file: " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  if (header_len > file_size - 8)
    return bad(path, "truncated or not a safetensors file: header length " + std::to_string(header_len) +
                         " exceeds the file size " + std::to_string(file_size));
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  json h;
  try {
    h = json::parse(header);
  } catch (const json::exception& e) {
    return bad(path, std::string("bad safetensors header (not JSON): ") + e.what());
  }
  if (!h.is_object()) return bad(path, "bad safetensors header: expected a JSON object");

  SafetensorsFile f;
  f.path_ = path;
  const uint64_t data_size = file_size - 8 - header_len;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return bad(path, "bad safetensors header: __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return bad(path, "bad safetensors header: __metadata__." + m.key() + " is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "bad safetensors header entry for tensor '" + name + "': ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      return bad(path, where + "needs dtype, shape and data_offsets");
    SafetensorsEntry e;
    e.name = name;
    if (!v["dtype"].is_string()) return bad(path, where + "dtype is not a string");
    e.dtype = v["dtype"].get<std::string>();
    const size_t esize = dtype_size(e.dtype);
    if (esize == 0) return bad(path, where + "unknown dtype '" + e.dtype + "'");
    if (!v["shape"].is_array()) return bad(path, where + "shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) return bad(path, where + "shape has a non-integer or negative dimension");
      if (d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, d.get<uint64_t>(), &numel))
        return bad(path, where + "shape " + v["shape"].dump() + " has more elements than 2^64");
      e.shape.push_back(d.get<int64_t>());
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return bad(path, where + "data_offsets must be [begin, end]");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.end < e.begin) return bad(path, where + "data_offsets end < begin");
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(esize), &nbytes) || e.end - e.begin != nbytes)
      return bad(path, where + "data_offsets cover " + std::to_string(e.end - e.begin) + " bytes but " + e.dtype +
                           " " + shape_string(e.shape) + " needs " + (nbytes == numel * esize ? std::to_string(nbytes) : "more than 2^64"));
    if (e.end > data_size)
      return bad(path, "truncated safetensors file: tensor '" + name + "' ends at byte " + std::to_string(e.end) +
                           " of the data section, which has only " + std::to_string(data_size) + " bytes");
    f.index_[name] = f.entries_.size();
    f.entries_.push_back(std::move(e));
  }
  std::sort(f.entries_.begin(), f.entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  f.data_start_ = 8 + header_len;
  if (load == DataLoad::on_demand) {  // (read_values reads each range's bytes from this descriptor)
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return bad(path, std::string("cannot open safetensors file (") + std::strerror(errno) + ")");
    f.fd_ = std::make_shared<const Descriptor>(fd);
    return f;
  }
  f.data_ = std::make_shared<std::vector<char>>(data_size);
  in.read(f.data_->data(), static_cast<std::streamsize>(data_size));
  if (static_cast<uint64_t>(in.gcount()) != data_size) return bad(path, "read error in the data section");
  g_data_bytes_read.fetch_add(data_size, std::memory_order_relaxed);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Status SafetensorsFile::read_values(const SafetensorsEntry& e, size_t first, size_t n, float* out) const {
  const size_t esize = dtype_size(e.dtype);
  if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16" && e.dtype != "F64")
    return bad(path_, "tensor '" + e.name + "' has dtype " + e.dtype + "; troupe reads F32, BF16, F16 and F64 weights");
  if (n == 0) return {};  // an empty tensor: no bytes to read (data_ may be empty, its data() null)
  std::vector<char> bytes;  // on demand: the range's bytes, read from the file now
  const char* src = nullptr;
  if (data_) {
    src = data_->data() + e.begin + first * esize;
  } else {
    bytes.resize(n * esize);
    TROUPE_TRY(pread_all(e, data_start_ + e.begin + first * esize, bytes));
    src = bytes.data();
  }
  if (e.dtype == "F32") {
    std::memcpy(out, src, n * 4);
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    const bool bf = e.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = bf ? bf16_to_float(h) : f16_to_float(h);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  }
  return {};
}

Status SafetensorsFile::pread_all(const SafetensorsEntry& e, uint64_t at, std::vector<char>& bytes) const {
  size_t done = 0;
  while (done < bytes.size()) {  // (pread(2) may return fewer bytes than asked; 0 is the file's end)
    const ssize_t got = ::pread(fd_->fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(at + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return bad(path_, "cannot read tensor '" + e.name + "' (" + (got < 0 ? std::strerror(errno) : "the file ends early") + ")");
    done += static_cast<size_t>(got);
  }
  g_data_bytes_read.fetch_add(bytes.size(), std::memory_order_relaxed);
  return {};
}

Status SafetensorsFile::read_flat(const std::string& name, size_t first, std::span<float> out) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return bad(path_, "missing tensor '" + name + "'");
  size_t numel = 1;
  for (auto d : e->shape) numel *= static_cast<size_t>(d);
  if (first > numel || out.size() > numel - first)
    return bad(path_, "tensor '" + name + "' of shape " + shape_string(e->shape) + " has no values [" +
                          std::to_string(first) + ", " + std::to_string(first + out.size()) + ")");
  return read_values(*e, first, out.size(), out.data());
}

Result<Tensor> SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return bad(path_, "missing tensor '" + name + "'");
  Tensor t;
  t.shape = e->shape;
  t.data.resize(t.numel());
  TROUPE_TRY(read_values(*e, 0, t.data.size(), t.data.data()));
  return t;
}

Result<Tensor> SafetensorsFile::read_rows(const std::string& name, const std::vector<int64_t>& shape, int64_t first,
                                          int64_t count) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return bad(path_, "missing tensor '" + name + "'");
  if (e->shape != shape)
    return bad(path_, "tensor '" + name + "' has shape " + shape_string(e->shape) + ", expected " + shape_string(shape));
  if (shape.empty() || first < 0 || count < 0 || first + count > shape[0])
    return bad(path_, "tensor '" + name + "' of shape " + shape_string(shape) + " has no rows [" +
                          std::to_string(first) + ", " + std::to_string(first + count) + ")");
  Tensor t;
  t.shape = shape;
  t.shape[0] = count;
  size_t row = 1;  // values per row
  for (size_t d = 1; d < shape.size(); ++d) row *= static_cast<size_t>(shape[d]);
  t.data.resize(t.numel());
  TROUPE_TRY(read_values(*e, static_cast<size_t>(first) * row, t.data.size(), t.data.data()));
  return t;
}

Result<Tensor> SafetensorsFile::read(const std::string& name, const std::vector<int64_t>& shape) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return bad(path_, "missing tensor '" + name + "'");
  if (e->shape != shape)
    return bad(path_, "tensor '" + name + "' has shape " + shape_string(e->shape) + ", expected " + shape_string(shape));
  return read(name);
}

Result<TensorMap> read_safetensors(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path));
  TensorMap out;
  for (const auto& e : f.entries()) {
    TROUPE_ASSIGN_OR_RETURN(out[e.name], f.read(e.name));
  }
  return out;
}

Status write_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata, DType dtype) {
  const size_t esize = dtype == DType::f32 ? 4 : 2;
  json h = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (t.data.size() != t.numel())
      return make_error(ErrorCode::internal, path + ": tensor '" + name + "' has " + std::to_string(t.data.size()) +
                                                 " values but shape " + shape_string(t.shape));
    const uint64_t bytes = t.numel() * esize;
    h[name] = {{"dtype", dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = h.dump();
  while (header.size() % 8) header.push_back(' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return make_error(ErrorCode::io, tmp + ": cannot write (" + std::strerror(errno) + ")");
    const uint64_t len = header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    std::vector<uint16_t> buf;
    for (const auto& [name, t] : tensors) {
      if (dtype == DType::f32) {
        out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size() * 4));
      } else {
        buf.resize(t.data.size());
        for (size_t i = 0; i < buf.size(); ++i)
          buf[i] = dtype == DType::bf16 ? float_to_bf16(t.data[i]) : float_to_f16(t.data[i]);
        out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 2));
      }
    }
    out.flush();
    if (!out) return make_error(ErrorCode::io, tmp + ": write failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return make_error(ErrorCode::io, path + ": cannot rename from " + tmp + " (" + ec.message() + ")");
  return {};
}

// ---- WeightSource: one file or an index of shards ----

Result<WeightSource> WeightSource::open_file(const std::string& path, DataLoad load) {
  TROUPE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path, load));
  WeightSource w;
  w.description_ = path;
  for (const auto& e : f.entries()) w.where_[e.name] = 0;
  w.files_.push_back(std::move(f));
  return w;
}

Result<WeightSource> WeightSource::open_index(const std::string& index_path, DataLoad load) {
  std::ifstream in(index_path);
  if (!in) return bad(index_path, "cannot open the shard index");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    return bad(index_path, std::string("bad shard index (not JSON): ") + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return bad(index_path, "bad shard index: needs an object \"weight_map\" {tensor: file}");
  const fs::path dir = fs::path(index_path).parent_path();
  WeightSource w;
  w.description_ = index_path;
  std::map<std::string, size_t> shard_index;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) return bad(index_path, "weight_map['" + it.key() + "'] is not a file name");
    const std::string shard = it.value().get<std::string>();
    if (shard.find('/') != std::string::npos || shard == "..")
      return bad(index_path, "weight_map['" + it.key() + "'] names '" + shard + "', outside the model directory");
    auto s = shard_index.find(shard);
    if (s == shard_index.end()) {
      TROUPE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open((dir / shard).string(), load));
      s = shard_index.emplace(shard, w.files_.size()).first;
      w.files_.push_back(std::move(f));
    }
    if (!w.files_[s->second].find(it.key()))
      return bad(index_path, "tensor '" + it.key() + "' is listed in shard " + shard + " but missing from " +
                                 w.files_[s->second].path());
    w.where_[it.key()] = s->second;
  }
  return w;
}

Result<WeightSource> WeightSource::open_dir(const std::string& dir, DataLoad load) {
  const fs::path d(dir);
  if (fs::exists(d / "model.safetensors")) return open_file((d / "model.safetensors").string(), load);
  if (fs::exists(d / "model.safetensors.index.json"))
    return open_index((d / "model.safetensors.index.json").string(), load);
  return bad((d / "model.safetensors").string(), "missing weights file (no model.safetensors or model.safetensors.index.json in " + dir + ")");
}

std::vector<std::string> WeightSource::names() const {
  std::vector<std::string> n;
  n.reserve(where_.size());
  for (const auto& [k, v] : where_) n.push_back(k);
  return n;
}

const SafetensorsEntry* WeightSource::find(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second].find(name);
}

std::string WeightSource::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : files_[it->second].path();
}

Result<Tensor> WeightSource::read(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return bad(description_, "missing tensor '" + name + "'");
  return files_[it->second].read(name);
}

Result<Tensor> WeightSource::read(const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = where_.find(name);
  if (it == where_.end()) return bad(description_, "missing tensor '" + name + "'");
  return files_[it->second].read(name, shape);
}

Result<Tensor> WeightSource::read_rows(const std::string& name, const std::vector<int64_t>& shape, int64_t first,
                                       int64_t count) const {
  auto it = where_.find(name);
  if (it == where_.end()) return bad(description_, "missing tensor '" + name + "'");
  return files_[it->second].read_rows(name, shape, first, count);
}

Status WeightSource::read_flat(const std::string& name, size_t first, std::span<float> out) const {
  auto it = where_.find(name);
  if (it == where_.end()) return bad(description_, "missing tensor '" + name + "'");
  return files_[it->second].read_flat(name, first, out);
}

Result<TensorMap> WeightSource::read_all() const {
  TensorMap out;
  for (const auto& [name, i] : where_) {
    TROUPE_ASSIGN_OR_RETURN(out[name], files_[i].read(name));
  }
  return out;
}

}  // namespace troupe::policy::io
