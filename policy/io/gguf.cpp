// GGUF reader. A Cursor walks the file with every read checked against its end, so a truncated
// or corrupt file is an error naming the file and the field, never a read past the buffer. The
// dequantizers follow ggml's block layouts (blocks of 32 values, super-blocks of 256 for K-quants)
// and compute in the same fp32 order as ggml, so values equal the gguf package's dequantization.
#include "troupe/policy/io/gguf.h"

#include <bit>
#include <cstring>
#include <fstream>

static_assert(std::endian::native == std::endian::little, "troupe's GGUF reader assumes a little-endian host");

namespace troupe::policy::io {

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: return "uint8";
    case GgufValueType::i8: return "int8";
    case GgufValueType::u16: return "uint16";
    case GgufValueType::i16: return "int16";
    case GgufValueType::u32: return "uint32";
    case GgufValueType::i32: return "int32";
    case GgufValueType::f32: return "float32";
    case GgufValueType::boolean: return "bool";
    case GgufValueType::string: return "string";
    case GgufValueType::array: return "array";
    case GgufValueType::u64: return "uint64";
    case GgufValueType::i64: return "int64";
    case GgufValueType::f64: return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::u16: case GgufValueType::i16:
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::u64: case GgufValueType::i64:
      return true;
    default: return false;
  }
}

namespace {

struct TypeTraits {
  uint32_t type;
  const char* name;
  int64_t block;     // values per block
  uint64_t bytes;    // bytes per block
  bool supported;
};

constexpr TypeTraits kTypes[] = {
    {ggml_type::F32, "F32", 1, 4, true},       {ggml_type::F16, "F16", 1, 2, true},
    {ggml_type::Q4_0, "Q4_0", 32, 18, true},   {ggml_type::Q4_1, "Q4_1", 32, 20, true},
    {ggml_type::Q5_0, "Q5_0", 32, 22, false},  {ggml_type::Q5_1, "Q5_1", 32, 24, false},
    {ggml_type::Q8_0, "Q8_0", 32, 34, true},   {ggml_type::Q8_1, "Q8_1", 32, 36, false},
    {ggml_type::Q2_K, "Q2_K", 256, 84, false}, {ggml_type::Q3_K, "Q3_K", 256, 110, false},
    {ggml_type::Q4_K, "Q4_K", 256, 144, true}, {ggml_type::Q5_K, "Q5_K", 256, 176, true},
    {ggml_type::Q6_K, "Q6_K", 256, 210, true}, {ggml_type::Q8_K, "Q8_K", 256, 292, false},
    {ggml_type::BF16, "BF16", 1, 2, true},
};

const TypeTraits* traits(uint32_t type) {
  for (const auto& t : kTypes)
    if (t.type == type) return &t;
  return nullptr;
}

// Bounds-checked little-endian reader over the file's bytes.
class Cursor {
 public:
  Cursor(const std::vector<uint8_t>& b, const std::string& path) : b_(b), path_(path) {}
  uint64_t pos() const { return pos_; }

  template <class T>
  Result<T> scalar(const std::string& what) {
    if (b_.size() - pos_ < sizeof(T)) return truncated(what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  Result<std::string> string(const std::string& what) {
    TROUPE_ASSIGN_OR_RETURN(uint64_t n, scalar<uint64_t>(what + " (string length)"));
    if (n > b_.size() - pos_)
      return invalid_input(path_ + ": " + what + ": string length " + std::to_string(n) + " runs past the end of the file (" +
                           std::to_string(b_.size() - pos_) + " bytes left)");
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  Error truncated(const std::string& what) const {
    return invalid_input(path_ + ": truncated file: " + what + " at byte " + std::to_string(pos_) + " runs past the end (" +
                         std::to_string(b_.size()) + " bytes)");
  }
  uint64_t left() const { return b_.size() - pos_; }

 private:
  const std::vector<uint8_t>& b_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

Result<GgufValue> read_value(Cursor& c, GgufValueType type, const std::string& what, const std::string& path,
                             int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufValueType::u8: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<uint8_t>(what)); v.u = x, v.i = x; break; }
    case GgufValueType::i8: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<int8_t>(what)); v.i = x, v.u = static_cast<uint64_t>(x); break; }
    case GgufValueType::u16: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<uint16_t>(what)); v.u = x, v.i = x; break; }
    case GgufValueType::i16: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<int16_t>(what)); v.i = x, v.u = static_cast<uint64_t>(x); break; }
    case GgufValueType::u32: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<uint32_t>(what)); v.u = x, v.i = x; break; }
    case GgufValueType::i32: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<int32_t>(what)); v.i = x, v.u = static_cast<uint64_t>(x); break; }
    case GgufValueType::u64: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<uint64_t>(what)); v.u = x, v.i = static_cast<int64_t>(x); break; }
    case GgufValueType::i64: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<int64_t>(what)); v.i = x, v.u = static_cast<uint64_t>(x); break; }
    case GgufValueType::f32: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<float>(what)); v.f = x; break; }
    case GgufValueType::f64: { TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<double>(what)); v.f = x; break; }
    case GgufValueType::boolean: {
      TROUPE_ASSIGN_OR_RETURN(auto x, c.scalar<uint8_t>(what));
      if (x > 1) return invalid_input(path + ": " + what + ": bool value " + std::to_string(x) + " is neither 0 nor 1");
      v.b = x != 0, v.u = x, v.i = x;
      break;
    }
    case GgufValueType::string: { TROUPE_ASSIGN_OR_RETURN(v.s, c.string(what)); break; }
    case GgufValueType::array: {
      if (depth > 0) return invalid_input(path + ": " + what + ": nested arrays are not supported");
      TROUPE_ASSIGN_OR_RETURN(uint32_t et, c.scalar<uint32_t>(what + " (array element type)"));
      if (et > static_cast<uint32_t>(GgufValueType::f64))
        return invalid_input(path + ": " + what + ": unknown array element type " + std::to_string(et));
      v.elem_type = static_cast<GgufValueType>(et);
      TROUPE_ASSIGN_OR_RETURN(uint64_t n, c.scalar<uint64_t>(what + " (array length)"));
      // Every element takes at least one byte, so a count beyond the bytes left is corrupt.
      if (n > c.left())
        return invalid_input(path + ": " + what + ": array of " + std::to_string(n) + " elements runs past the end of the file");
      v.array.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        TROUPE_ASSIGN_OR_RETURN(auto e, read_value(c, v.elem_type, what, path, depth + 1));
        v.array.push_back(std::move(e));
      }
      break;
    }
    default: return invalid_input(path + ": " + what + ": unknown value type " + std::to_string(static_cast<uint32_t>(type)));
  }
  return v;
}

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_float(h);
}

// K-quant 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63, m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void dequant_block(uint32_t type, const uint8_t* b, float* y) {
  switch (type) {
    case ggml_type::Q8_0: {  // f16 d, int8 q[32]: y = d * q
      const float d = h2f(b);
      for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(static_cast<int8_t>(b[2 + l]));
      break;
    }
    case ggml_type::Q4_0: {  // f16 d, 16 bytes of nibbles: low nibbles are y[0..16), high y[16..32)
      const float d = h2f(b);
      for (int l = 0; l < 16; ++l) {
        y[l] = d * static_cast<float>((b[2 + l] & 0xF) - 8);
        y[l + 16] = d * static_cast<float>((b[2 + l] >> 4) - 8);
      }
      break;
    }
    case ggml_type::Q4_1: {  // f16 d, f16 m, nibbles: y = d * q + m
      const float d = h2f(b), m = h2f(b + 2);
      for (int l = 0; l < 16; ++l) {
        y[l] = d * static_cast<float>(b[4 + l] & 0xF) + m;
        y[l + 16] = d * static_cast<float>(b[4 + l] >> 4) + m;
      }
      break;
    }
    case ggml_type::Q4_K: {  // f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes; 8 sub-blocks of 32
      const float d = h2f(b), dmin = h2f(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* q = b + 16;
      for (int j = 0; j < 4; ++j) {  // 64 values per step: low nibbles then high nibbles of 32 bytes
        uint8_t sc, m;
        scale_min_k4(2 * j, scales, sc, m);
        const float d1 = d * sc, m1 = dmin * m;
        scale_min_k4(2 * j + 1, scales, sc, m);
        const float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; ++l) y[64 * j + l] = d1 * static_cast<float>(q[32 * j + l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l) y[64 * j + 32 + l] = d2 * static_cast<float>(q[32 * j + l] >> 4) - m2;
      }
      break;
    }
    case ggml_type::Q5_K: {  // as Q4_K plus qh[32]: bit 2j / 2j+1 of qh[l] is the fifth bit
      const float d = h2f(b), dmin = h2f(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* ql = b + 48;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc, m;
        scale_min_k4(2 * j, scales, sc, m);
        const float d1 = d * sc, m1 = dmin * m;
        scale_min_k4(2 * j + 1, scales, sc, m);
        const float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; ++l) {
          const int hi = (qh[l] >> (2 * j)) & 1;
          y[64 * j + l] = d1 * static_cast<float>((ql[32 * j + l] & 0xF) | (hi << 4)) - m1;
        }
        for (int l = 0; l < 32; ++l) {
          const int hi = (qh[l] >> (2 * j + 1)) & 1;
          y[64 * j + 32 + l] = d2 * static_cast<float>((ql[32 * j + l] >> 4) | (hi << 4)) - m2;
        }
      }
      break;
    }
    case ggml_type::Q6_K: {  // ql[128], qh[64], int8 scales[16], f16 d; two halves of 128 values
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = h2f(b + 208);
      for (int half = 0; half < 2; ++half) {
        const uint8_t* L = ql + 64 * half;
        const uint8_t* H = qh + 32 * half;
        const int8_t* S = sc + 8 * half;
        float* Y = y + 128 * half;
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
          Y[l] = (d * static_cast<float>(S[is + 0])) * static_cast<float>(q1);
          Y[l + 32] = (d * static_cast<float>(S[is + 2])) * static_cast<float>(q2);
          Y[l + 64] = (d * static_cast<float>(S[is + 4])) * static_cast<float>(q3);
          Y[l + 96] = (d * static_cast<float>(S[is + 6])) * static_cast<float>(q4);
        }
      }
      break;
    }
    default: break;
  }
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  const TypeTraits* t = traits(type);
  return t ? t->name : "type " + std::to_string(type);
}

bool ggml_type_supported(uint32_t type) {
  const TypeTraits* t = traits(type);
  return t && t->supported;
}

std::vector<int64_t> GgufTensorInfo::shape() const { return std::vector<int64_t>(ne.rbegin(), ne.rend()); }

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

Status ggml_dequantize(uint32_t type, const uint8_t* data, uint64_t nbytes, int64_t n, float* out, const std::string& what) {
  const TypeTraits* t = traits(type);
  if (!t || !t->supported)
    return invalid_input(what + ": tensor type " + ggml_type_name(type) +
                         " is not supported (troupe reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)");
  if (n % t->block != 0)
    return invalid_input(what + ": " + std::to_string(n) + " values are not a whole number of " + t->name + " blocks of " +
                         std::to_string(t->block));
  const uint64_t blocks = static_cast<uint64_t>(n / t->block);
  if (blocks * t->bytes != nbytes)
    return invalid_input(what + ": " + std::to_string(nbytes) + " bytes, " + t->name + " x " + std::to_string(n) + " values needs " +
                         std::to_string(blocks * t->bytes));
  switch (type) {
    case ggml_type::F32: std::memcpy(out, data, nbytes); break;
    case ggml_type::F16:
      for (int64_t k = 0; k < n; ++k) out[k] = h2f(data + 2 * k);
      break;
    case ggml_type::BF16:
      for (int64_t k = 0; k < n; ++k) {
        uint16_t h;
        std::memcpy(&h, data + 2 * k, 2);
        out[k] = bf16_to_float(h);
      }
      break;
    default:
      for (uint64_t k = 0; k < blocks; ++k) dequant_block(type, data + k * t->bytes, out + k * t->block);
  }
  return {};
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return invalid_input(path + ": cannot open GGUF file");
  const auto size = static_cast<std::streamoff>(in.tellg());
  in.seekg(0);
  f.bytes_ = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(f.bytes_->data()), size)) return invalid_input(path + ": cannot read GGUF file");
  const auto& b = *f.bytes_;
  Cursor c(b, f.path_);

  TROUPE_ASSIGN_OR_RETURN(uint32_t magic, c.scalar<uint32_t>("magic"));
  if (magic != 0x46554747u) return invalid_input(path + ": bad magic (not a GGUF file: the first 4 bytes are not \"GGUF\")");
  TROUPE_ASSIGN_OR_RETURN(f.version_, c.scalar<uint32_t>("version"));
  if (f.version_ != 2 && f.version_ != 3)
    return invalid_input(path + ": GGUF version " + std::to_string(f.version_) + " is not supported (2 or 3)");
  TROUPE_ASSIGN_OR_RETURN(uint64_t n_tensors, c.scalar<uint64_t>("tensor count"));
  TROUPE_ASSIGN_OR_RETURN(uint64_t n_kv, c.scalar<uint64_t>("metadata count"));
  // A key/value takes at least 13 bytes (key length, type, one byte), a tensor info at least 24.
  if (n_kv > c.left() / 13)
    return invalid_input(path + ": metadata count " + std::to_string(n_kv) + " is beyond what the file can hold");
  if (n_tensors > c.left() / 24)
    return invalid_input(path + ": tensor count " + std::to_string(n_tensors) + " is beyond what the file can hold");

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string what = "metadata entry " + std::to_string(k);
    TROUPE_ASSIGN_OR_RETURN(std::string key, c.string(what + " key"));
    TROUPE_ASSIGN_OR_RETURN(uint32_t type, c.scalar<uint32_t>("type of metadata key '" + key + "'"));
    if (type > static_cast<uint32_t>(GgufValueType::f64))
      return invalid_input(path + ": metadata key '" + key + "' has unknown value type " + std::to_string(type));
    TROUPE_ASSIGN_OR_RETURN(auto v, read_value(c, static_cast<GgufValueType>(type), "metadata key '" + key + "'", path, 0));
    if (f.metadata_.count(key)) return invalid_input(path + ": metadata key '" + key + "' appears twice");
    f.metadata_.emplace(std::move(key), std::move(v));
  }
  if (const GgufValue* a = f.get("general.alignment")) {
    if (!a->is_integer() || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20))
      return invalid_input(path + ": general.alignment must be a power of two integer (got " +
                           (a->is_integer() ? std::to_string(a->u) : std::string(gguf_value_type_name(a->type))) + ")");
    f.alignment_ = a->u;
  }

  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    TROUPE_ASSIGN_OR_RETURN(t.name, c.string("tensor info " + std::to_string(k) + " name"));
    const std::string what = "tensor '" + t.name + "'";
    TROUPE_ASSIGN_OR_RETURN(uint32_t n_dims, c.scalar<uint32_t>(what + " dimension count"));
    if (n_dims > 4) return invalid_input(path + ": " + what + " has " + std::to_string(n_dims) + " dimensions (at most 4)");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      TROUPE_ASSIGN_OR_RETURN(uint64_t ne, c.scalar<uint64_t>(what + " dimension"));
      if (ne == 0 || ne > (1ull << 40) || numel > static_cast<int64_t>((1ull << 40) / ne))
        return invalid_input(path + ": " + what + " has a bad dimension " + std::to_string(ne));
      t.ne.push_back(static_cast<int64_t>(ne));
      numel *= static_cast<int64_t>(ne);
    }
    TROUPE_ASSIGN_OR_RETURN(t.type, c.scalar<uint32_t>(what + " type"));
    TROUPE_ASSIGN_OR_RETURN(t.offset, c.scalar<uint64_t>(what + " data offset"));
    if (t.offset % f.alignment_ != 0)
      return invalid_input(path + ": " + what + " data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                           std::to_string(f.alignment_));
    if (const TypeTraits* tt = traits(t.type)) {
      if (t.ne.empty() || t.ne[0] % tt->block != 0)
        return invalid_input(path + ": " + what + ": rows of " + (t.ne.empty() ? std::string("0") : std::to_string(t.ne[0])) +
                             " values are not a whole number of " + tt->name + " blocks of " + std::to_string(tt->block));
      t.nbytes = static_cast<uint64_t>(numel / tt->block) * tt->bytes;
    }
    if (f.index_.count(t.name)) return invalid_input(path + ": tensor '" + t.name + "' appears twice");
    f.index_[t.name] = f.tensors_.size();
    f.tensors_.push_back(std::move(t));
  }
  f.data_start_ = (c.pos() + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (n_tensors > 0 && f.data_start_ > b.size())
    return invalid_input(path + ": truncated file: the data section (byte " + std::to_string(f.data_start_) +
                         ") starts past the end (" + std::to_string(b.size()) + " bytes)");
  const uint64_t data_size = f.data_start_ <= b.size() ? b.size() - f.data_start_ : 0;
  for (const auto& t : f.tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      return invalid_input(path + ": tensor '" + t.name + "' (" + ggml_type_name(t.type) + ", " + std::to_string(t.nbytes) +
                           " bytes at data offset " + std::to_string(t.offset) + ") runs past the end of the file (data section of " +
                           std::to_string(data_size) + " bytes; truncated file?)");
  }
  return f;
}

const GgufTensorInfo* GgufFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::get(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

// The value under `key` if it exists and `accept` takes it, converted; else an error naming the file and key.
template <class T, class Accept, class Convert>
Result<T> typed(const GgufFile& f, const std::string& key, const char* want, Accept accept, Convert convert) {
  const GgufValue* v = f.get(key);
  if (!v) return invalid_input(f.path() + ": metadata key '" + key + "' is missing");
  if (!accept(*v)) return invalid_input(f.path() + ": metadata key '" + key + "' is " + gguf_value_type_name(v->type) + ", expected " + want);
  return T(convert(*v));
}

bool is_array_of(const GgufValue& v, bool (*elem)(const GgufValue&)) {
  GgufValue probe;
  probe.type = v.elem_type;
  return v.type == GgufValueType::array && elem(probe);
}

template <class T, class Convert>
std::vector<T> each(const GgufValue& v, Convert convert) {
  std::vector<T> out;
  out.reserve(v.array.size());
  for (const auto& e : v.array) out.push_back(convert(e));
  return out;
}

bool integer(const GgufValue& v) { return v.is_integer(); }
bool number(const GgufValue& v) { return v.is_integer() || v.is_float(); }
bool text(const GgufValue& v) { return v.type == GgufValueType::string; }
double as_double(const GgufValue& v) { return v.is_float() ? v.f : static_cast<double>(v.i); }

}  // namespace

Result<int64_t> GgufFile::get_int(const std::string& key) const {
  return typed<int64_t>(*this, key, "an integer", integer, [](const GgufValue& v) { return v.i; });
}

Result<double> GgufFile::get_float(const std::string& key) const {
  return typed<double>(*this, key, "a number", number, as_double);
}

Result<std::string> GgufFile::get_string(const std::string& key) const {
  return typed<std::string>(*this, key, "a string", text, [](const GgufValue& v) { return v.s; });
}

Result<bool> GgufFile::get_bool(const std::string& key) const {
  return typed<bool>(*this, key, "a bool", [](const GgufValue& v) { return v.type == GgufValueType::boolean; },
                     [](const GgufValue& v) { return v.b; });
}

Result<std::vector<std::string>> GgufFile::get_strings(const std::string& key) const {
  return typed<std::vector<std::string>>(*this, key, "an array of strings", [](const GgufValue& v) { return is_array_of(v, text); },
                                         [](const GgufValue& v) { return each<std::string>(v, [](const GgufValue& e) { return e.s; }); });
}

Result<std::vector<double>> GgufFile::get_floats(const std::string& key) const {
  return typed<std::vector<double>>(*this, key, "an array of numbers", [](const GgufValue& v) { return is_array_of(v, number); },
                                    [](const GgufValue& v) { return each<double>(v, as_double); });
}

Result<std::vector<int64_t>> GgufFile::get_ints(const std::string& key) const {
  return typed<std::vector<int64_t>>(*this, key, "an array of integers", [](const GgufValue& v) { return is_array_of(v, integer); },
                                     [](const GgufValue& v) { return each<int64_t>(v, [](const GgufValue& e) { return e.i; }); });
}

Result<Tensor> GgufFile::read(const std::string& name) const {
  const GgufTensorInfo* t = find(name);
  if (!t) return invalid_input(path_ + ": no tensor '" + name + "'");
  Tensor out;
  out.shape = t->shape();
  out.data.resize(static_cast<size_t>(t->numel()));
  TROUPE_TRY(ggml_dequantize(t->type, bytes_->data() + data_start_ + t->offset, t->nbytes, t->numel(), out.data.data(),
                             path_ + ": tensor '" + name + "'"));
  return out;
}

}  // namespace troupe::policy::io
