// The weight-sync codec (weight_codec.h): generator dtypes, full and delta payloads, per-tensor
// checksums, the probe. Chunks are encoded and decoded in parallel (OpenMP, the calling role's
// threads); a delta is applied in place and undone (XOR is its own inverse) when a chunk does not
// decode or a tensor fails its checksum, so a receiver never holds a mix of two versions.
#include "troupe/actors/weight_codec.h"

#include <omp.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <type_traits>
#include <cstring>
#include <memory>

namespace troupe::actors {

namespace {

// zstd level 1: what it gets is a bitmap and a few bytes per change; higher levels only cost time.
constexpr int kZstdLevel = 1;

// Bytes per value on the wire: the bf16 half of the bits, or all of them.
size_t width_of(WeightDtype d) { return d == WeightDtype::bf16 ? 2 : 4; }

// The bits of x rounded to bf16 (ties to even; NaN kept, quiet), low half zero. Branch-free, so the
// loops below vectorize.
inline std::uint32_t bf16_bits(std::uint32_t u) {
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const std::uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

// The kernels, one instance per wire width W (2: bf16, 4: fp32); x86 is little-endian, so a
// value's wire bytes are the low W bytes of its wire bits.
template <int W>
inline std::uint32_t to_dtype_bits(std::uint32_t u) {
  if constexpr (W == 2) return bf16_bits(u);
  else return u;
}
template <int W>
inline std::uint32_t to_wire(std::uint32_t value_bits) {
  if constexpr (W == 2) return value_bits >> 16;
  else return value_bits;
}
template <int W>
inline std::uint32_t from_wire(std::uint32_t wire) {
  if constexpr (W == 2) return wire << 16;
  else return wire;
}

// The encoder keeps what the receivers hold in wire form: u16 per bf16 value, u32 per fp32 one.
template <int W>
using WireT = std::conditional_t<W == 2, std::uint16_t, std::uint32_t>;

// Full: master -> held (wire form), which is also the payload (element after element).
template <int W>
void encode_full(const float* __restrict m, WireT<W>* __restrict held, std::uint8_t* __restrict dst, size_t n) {
  const auto N = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < N; ++i) {
    const auto wire = static_cast<WireT<W>>(to_wire<W>(to_dtype_bits<W>(std::bit_cast<std::uint32_t>(m[i]))));
    held[i] = wire;
    std::memcpy(dst + W * static_cast<size_t>(i), &wire, W);
  }
}
template <int W>
void decode_full(const std::uint8_t* __restrict src, float* __restrict out, size_t n) {
  const auto N = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < N; ++i) {
    std::uint32_t wire;
    if constexpr (W == 2) {
      std::uint16_t h;
      std::memcpy(&h, src + 2 * static_cast<size_t>(i), 2);
      wire = h;
    } else {
      std::memcpy(&wire, src + 4 * static_cast<size_t>(i), 4);
    }
    out[i] = std::bit_cast<float>(from_wire<W>(wire));
  }
}
// Delta, one chunk of len values, before zstd, in one of two layouts (Weights::chunk_format):
//   sparse (bf16): [bitmap: ceil(len / 64) little-endian u64 words, bit i set = value i changed]
//                  [W byte planes of the changed values' XORs, in order: plane p holds byte p of each]
//   dense (fp32):  [W byte planes of every value's XOR]
// A small update changes few bf16 values, so zstd only sees a bitmap and a few bytes per change,
// and the receiver only touches what changed. In fp32 a small update changes the low bits of
// nearly every value: the planes separate the XORs' zero high bytes from their random low ones.
constexpr std::uint8_t kChunkZstd = 1;    // a zstd frame (else stored as is)
constexpr std::uint8_t kChunkSparse = 2;  // the sparse layout (else dense)

inline size_t bitmap_words(size_t len) { return (len + 63) / 64; }
size_t chunk_count(size_t elements, size_t chunk) { return chunk == 0 ? 0 : (elements + chunk - 1) / chunk; }

// Sparse: held becomes the new values (only the changed ones are written); the bitmap gets a bit
// per changed value and `compact` each changed value's XOR, in order. Returns how many changed.
template <int W>
size_t encode_sparse(const float* __restrict m, WireT<W>* __restrict held, size_t len, std::uint8_t* __restrict bitmap,
                     std::uint32_t* __restrict compact) {
  size_t j = 0;
  for (size_t wd = 0, words = bitmap_words(len); wd < words; ++wd) {
    const size_t base = wd * 64, cnt = std::min<size_t>(64, len - base);
    std::uint32_t d[64];
    std::uint8_t nz[64] = {};
#pragma omp simd
    for (size_t i = 0; i < cnt; ++i) {
      d[i] = to_wire<W>(to_dtype_bits<W>(std::bit_cast<std::uint32_t>(m[base + i]))) ^ held[base + i];
      nz[i] = d[i] != 0;
    }
    // eight 0/1 bytes -> eight bits: the multiply moves byte k's bit to bit 56 + k, without carries
    std::uint64_t bits = 0;
    for (size_t g = 0; g < 8; ++g) {
      std::uint64_t eight;
      std::memcpy(&eight, nz + 8 * g, 8);
      bits |= ((eight * 0x0102040810204080ull) >> 56) << (8 * g);
    }
    std::memcpy(bitmap + wd * 8, &bits, 8);
    for (; bits; bits &= bits - 1) {
      const auto i = static_cast<size_t>(std::countr_zero(bits));
      held[base + i] = static_cast<WireT<W>>(held[base + i] ^ d[i]);
      compact[j++] = d[i];
    }
  }
  return j;
}
// W byte planes of n values.
template <int W>
void split_planes(const std::uint32_t* __restrict x, size_t n, std::uint8_t* __restrict planes) {
  for (int p = 0; p < W; ++p) {
    std::uint8_t* out = planes + static_cast<size_t>(p) * n;
#pragma omp simd
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(x[i] >> (8 * p));
  }
}
// Dense: held becomes the new values; x gets every value's XOR. Returns how many changed.
template <int W>
size_t encode_dense(const float* __restrict m, WireT<W>* __restrict held, size_t len, std::uint32_t* __restrict x) {
  size_t changed = 0;
#pragma omp simd reduction(+ : changed)
  for (size_t i = 0; i < len; ++i) {
    const auto wire = static_cast<WireT<W>>(to_wire<W>(to_dtype_bits<W>(std::bit_cast<std::uint32_t>(m[i]))));
    x[i] = static_cast<std::uint32_t>(wire ^ held[i]);
    changed += x[i] != 0;
    held[i] = wire;
  }
  return changed;
}
template <int W>
inline std::uint32_t join_planes(const std::uint8_t* planes, size_t n, size_t i) {
  std::uint32_t d = 0;
  for (int p = 0; p < W; ++p) d |= static_cast<std::uint32_t>(planes[static_cast<size_t>(p) * n + i]) << (8 * p);
  return d;
}
// The receiver: XORs one chunk's raw bytes into values (run twice, it restores them). False when
// the bytes do not have the size their layout says.
template <int W>
bool apply_chunk(const std::uint8_t* __restrict raw, size_t raw_size, bool sparse, float* __restrict v, size_t len) {
  if (!sparse) {
    if (raw_size != len * W) return false;
#pragma omp simd
    for (size_t i = 0; i < len; ++i)
      v[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v[i]) ^ from_wire<W>(join_planes<W>(raw, len, i)));
    return true;
  }
  const size_t words = bitmap_words(len);
  if (raw_size < words * 8) return false;
  auto word = [&](size_t wd) {
    std::uint64_t bits;
    std::memcpy(&bits, raw + wd * 8, 8);
    if (wd + 1 == words && len % 64) bits &= (std::uint64_t{1} << (len % 64)) - 1;
    return bits;
  };
  size_t changed = 0;
  for (size_t wd = 0; wd < words; ++wd) changed += static_cast<size_t>(std::popcount(word(wd)));
  if (raw_size != words * 8 + changed * W) return false;
  const std::uint8_t* planes = raw + words * 8;
  size_t j = 0;
  for (size_t wd = 0; wd < words; ++wd)
    for (std::uint64_t bits = word(wd); bits; bits &= bits - 1) {
      float& f = v[wd * 64 + static_cast<size_t>(std::countr_zero(bits))];
      f = std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) ^ from_wire<W>(join_planes<W>(planes, changed, j++)));
    }
  return true;
}

// Scratch memory that keeps its pages between syncs: a fresh multi-MB vector per chunk and call
// costs page faults and zero-filling comparable to the encoding itself.
struct Buffer {
  std::unique_ptr<std::uint8_t[]> data;
  size_t capacity = 0, size = 0;
  std::uint8_t* reserve(size_t n) {
    if (n > capacity) {
      data.reset(new std::uint8_t[n]);  // (not value-initialized: every byte used is written first)
      capacity = n;
    }
    size = n;
    return data.get();
  }
};
// Per OpenMP thread (the team's threads live on between calls): a chunk's XORs and raw bytes and the
// zstd contexts (not shareable between threads).
struct ThreadScratch {
  Buffer xors;  // a chunk's XORs (u32 each)
  Buffer raw;   // a chunk's bitmap and planes
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  ~ThreadScratch() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
  ZSTD_CCtx* compressor() { return cctx ? cctx : (cctx = ZSTD_createCCtx()); }
  ZSTD_DCtx* decompressor() { return dctx ? dctx : (dctx = ZSTD_createDCtx()); }
};
ThreadScratch& thread_scratch() {
  thread_local ThreadScratch s;
  return s;
}

}  // namespace

WeightDtype weight_dtype_of(const std::string& name) { return name == "bf16" ? WeightDtype::bf16 : WeightDtype::fp32; }
const char* weight_dtype_name(WeightDtype d) { return d == WeightDtype::bf16 ? "bf16" : "fp32"; }
const char* weights_status_name(WeightsStatus s) {
  switch (s) {
    case WeightsStatus::applied: return "applied";
    case WeightsStatus::checksum_failed: return "checksum_failed";
    case WeightsStatus::refused: return "refused";
    case WeightsStatus::probe_mismatch: return "probe_mismatch";
  }
  return "unknown";
}

float round_to_bf16(float x) { return std::bit_cast<float>(bf16_bits(std::bit_cast<std::uint32_t>(x))); }

void round_to_dtype(std::span<float> values, WeightDtype dtype) {
  if (dtype != WeightDtype::bf16) return;
  const auto n = static_cast<std::ptrdiff_t>(values.size());
  float* v = values.data();
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) v[i] = round_to_bf16(v[i]);
}

namespace {

// xxh3-64 of n values in wire form (bf16: the high halves, packed in blocks that stay in L1, so
// memory is read once).
std::uint64_t wire_hash(const float* v, size_t n, WeightDtype dtype) {
  if (dtype != WeightDtype::bf16) return XXH3_64bits(v, n * sizeof(float));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  constexpr size_t kBlock = 4096;
  std::uint16_t packed[kBlock];
  for (size_t a = 0; a < n; a += kBlock) {
    const size_t len = std::min(kBlock, n - a);
#pragma omp simd
    for (size_t i = 0; i < len; ++i) packed[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v[a + i]) >> 16);
    XXH3_64bits_update(st, packed, len * 2);
  }
  const std::uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

// The same checksums straight from a full payload (the values' wire bytes, element after element).
std::vector<std::uint64_t> payload_checksums(const std::uint8_t* payload, size_t W,
                                             const std::vector<policy::TensorSpec>& tensors) {
  std::vector<std::uint64_t> out(tensors.size(), 0);
  const auto n = static_cast<std::ptrdiff_t>(tensors.size());
#pragma omp parallel for schedule(dynamic)
  for (std::ptrdiff_t t = 0; t < n; ++t) {
    const auto& s = tensors[static_cast<size_t>(t)];
    out[static_cast<size_t>(t)] = XXH3_64bits(payload + s.offset * W, s.numel() * W);
  }
  return out;
}

}  // namespace

std::vector<std::uint64_t> weight_checksums(std::span<const float> values,
                                            const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype) {
  std::vector<std::uint64_t> out(tensors.size(), 0);
  const auto n = static_cast<std::ptrdiff_t>(tensors.size());
#pragma omp parallel for schedule(dynamic)
  for (std::ptrdiff_t t = 0; t < n; ++t) {
    const auto& s = tensors[static_cast<size_t>(t)];
    if (s.offset + s.numel() > values.size()) continue;  // (the caller checked the table against the arena)
    out[static_cast<size_t>(t)] = wire_hash(values.data() + s.offset, s.numel(), dtype);
  }
  return out;
}

// ---- learner 0: encoding ----------------------------------------------------------------------

struct WeightEncoder::Frames {
  std::vector<Buffer> chunk;  // per chunk: its compressed frame (or its raw bytes, stored as they are)
};

WeightEncoder::WeightEncoder(WeightDtype dtype, std::vector<policy::TensorSpec> tensors)
    : dtype_(dtype), tensors_(std::move(tensors)), frames_(std::make_unique<Frames>()) {}
WeightEncoder::~WeightEncoder() = default;

void WeightEncoder::encode(std::span<const float> master, std::int64_t version, bool delta, Weights& out) {
  if (dtype_ == WeightDtype::bf16)
    encode_as<2>(master, version, delta, out);
  else
    encode_as<4>(master, version, delta, out);
}

template <int W>
void WeightEncoder::encode_as(std::span<const float> master, std::int64_t version, bool delta, Weights& out) {
  auto& held_wire = [this]() -> std::vector<WireT<W>>& {
    if constexpr (W == 2) return held16_;
    else return held32_;
  }();
  const size_t n = master.size(), C = kWeightChunkElements;
  delta = delta && held_version_ >= 0 && held_wire.size() == n;
  if (held_wire.size() != n) held_wire.assign(n, 0);
  const size_t chunks = chunk_count(n, C);
  out = Weights{};
  out.version = version;
  out.base_version = delta ? held_version_ : -1;
  out.encoding = static_cast<std::int32_t>(delta ? WeightEncoding::delta : WeightEncoding::full);
  out.dtype = static_cast<std::int32_t>(dtype_);
  out.elements = n;
  out.chunk_elements = C;
  out.chunk_bytes.assign(chunks, 0);
  out.chunk_format.assign(chunks, 0);
  WireT<W>* held = held_wire.data();
  const float* m = master.data();
  if (!delta) {
    // Full: every value's wire bits, element after element, uncompressed (most bits of a weight are noise).
    out.payload.resize(n * W);
    encode_full<W>(m, held, out.payload.data(), n);
    for (size_t c = 0; c < chunks; ++c) out.chunk_bytes[c] = std::min(C, n - c * C) * W;
  } else {
    // Delta: per chunk, the bitmap of changed values and their XORs' byte planes (bf16: few
    // change), or the planes of every value's XOR (fp32: nearly all change), then zstd.
    constexpr bool sparse = W == 2;
    auto& frames = frames_->chunk;
    frames.resize(chunks);
    std::uint64_t changed = 0;
    const auto K = static_cast<std::ptrdiff_t>(chunks);
#pragma omp parallel for schedule(dynamic) reduction(+ : changed)
    for (std::ptrdiff_t k = 0; k < K; ++k) {
      ThreadScratch& ts = thread_scratch();
      const size_t c = static_cast<size_t>(k), a = c * C, len = std::min(C, n - a);
      auto* x = reinterpret_cast<std::uint32_t*>(ts.xors.reserve(len * 4));
      size_t ch = 0, raw_size = 0;
      std::uint8_t* raw = ts.raw.reserve(bitmap_words(len) * 8 + len * W);
      if constexpr (sparse) {
        ch = encode_sparse<W>(m + a, held + a, len, raw, x);
        raw_size = bitmap_words(len) * 8 + ch * W;
        split_planes<W>(x, ch, raw + bitmap_words(len) * 8);
      } else {
        ch = encode_dense<W>(m + a, held + a, len, x);
        raw_size = len * W;
        split_planes<W>(x, len, raw);
      }
      changed += ch;
      out.chunk_format[c] = sparse ? kChunkSparse : 0;
      Buffer& f = frames[c];
      const size_t bound = ZSTD_compressBound(raw_size);
      std::uint8_t* dst = f.reserve(bound);
      const size_t z = ZSTD_compressCCtx(ts.compressor(), dst, bound, raw, raw_size, kZstdLevel);
      if (ZSTD_isError(z) || z >= raw_size) {
        std::memcpy(dst, raw, raw_size);  // incompressible: stored as is
        f.size = raw_size;
      } else {
        f.size = z;
        out.chunk_format[c] |= kChunkZstd;
      }
    }
    size_t total = 0;
    for (size_t c = 0; c < chunks; ++c) total += (out.chunk_bytes[c] = frames[c].size);
    out.payload.resize(total);
    size_t at = 0;
    for (size_t c = 0; c < chunks; ++c) {
      std::memcpy(out.payload.data() + at, frames[c].data.get(), frames[c].size);
      at += frames[c].size;
    }
    out.changed = changed;
  }
  held_version_ = version;
  // the held wire form is exactly what the checksums cover (for a full sync, also the payload)
  out.checksums = payload_checksums(reinterpret_cast<const std::uint8_t*>(held), W, tensors_);
}

void WeightEncoder::held_into(std::span<float> out) const {
  const auto n = static_cast<std::ptrdiff_t>(std::min(out.size(), dtype_ == WeightDtype::bf16 ? held16_.size() : held32_.size()));
  float* o = out.data();
  if (dtype_ == WeightDtype::bf16) {
    const std::uint16_t* h = held16_.data();
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; ++i) o[i] = std::bit_cast<float>(static_cast<std::uint32_t>(h[i]) << 16);
  } else {
    std::memcpy(o, held32_.data(), static_cast<size_t>(n) * 4);
  }
}

std::vector<float> WeightEncoder::held() const {
  std::vector<float> v(dtype_ == WeightDtype::bf16 ? held16_.size() : held32_.size());
  held_into(v);
  return v;
}

// ---- a generator: applying ----------------------------------------------------------------------

WeightsApplied apply_weights(const Weights& w, std::span<float> values, const std::vector<policy::TensorSpec>& tensors,
                             WeightDtype dtype) {
  auto refused = [](std::string why) { return WeightsApplied{WeightsStatus::refused, std::move(why)}; };
  auto corrupt = [](std::string why) { return WeightsApplied{WeightsStatus::checksum_failed, std::move(why)}; };
  const auto enc = static_cast<WeightEncoding>(w.encoding);
  if (enc != WeightEncoding::full && enc != WeightEncoding::delta)
    return refused("encoding " + std::to_string(w.encoding) + " is neither full (1) nor delta (2)");
  if (w.dtype != static_cast<std::int32_t>(dtype))
    return refused(std::string("the weights are in ") +
                   weight_dtype_name(static_cast<WeightDtype>(w.dtype)) + ", this generator holds " +
                   weight_dtype_name(dtype) + " (weight_sync.dtype differs between the ranks)");
  if (w.elements != values.size())
    return refused(std::to_string(w.elements) + " values for a model of " + std::to_string(values.size()));
  if (w.checksums.size() != tensors.size())
    return refused(std::to_string(w.checksums.size()) + " tensor checksums for a model of " +
                   std::to_string(tensors.size()) + " tensors");
  const size_t n = values.size(), W = width_of(dtype), C = w.chunk_elements;
  const size_t chunks = chunk_count(n, C);
  if (C == 0 && n > 0) return corrupt("chunk_elements is 0");
  if (w.chunk_bytes.size() != chunks || w.chunk_format.size() != chunks)
    return corrupt(std::to_string(w.chunk_bytes.size()) + " chunks for " + std::to_string(n) + " values in chunks of " +
                   std::to_string(C));
  std::vector<size_t> at(chunks + 1, 0);
  for (size_t c = 0; c < chunks; ++c) at[c + 1] = at[c] + w.chunk_bytes[c];
  if (at[chunks] != w.payload.size())
    return corrupt("the chunks add up to " + std::to_string(at[chunks]) + " bytes, the payload has " +
                   std::to_string(w.payload.size()));
  const auto K = static_cast<std::ptrdiff_t>(chunks);
  const std::uint8_t* src = w.payload.data();

  auto first_failure = [&](const std::vector<std::uint64_t>& sums) -> std::string {
    for (size_t t = 0; t < tensors.size(); ++t)
      if (sums[t] != w.checksums[t])
        return "tensor " + tensors[t].name + " fails its checksum after version " + std::to_string(w.version) +
               (enc == WeightEncoding::delta ? " was applied to base version " + std::to_string(w.base_version) : "");
    return {};
  };

  if (enc == WeightEncoding::full) {
    for (size_t c = 0; c < chunks; ++c)
      if (w.chunk_format[c] != 0 || w.chunk_bytes[c] != std::min(C, n - c * C) * W)
        return corrupt("full chunk " + std::to_string(c) + " has " + std::to_string(w.chunk_bytes[c]) + " bytes");
    // The checksums are of the wire form, which a full payload is: checked before a value is written.
    for (const auto& t : tensors)
      if (t.offset + t.numel() > n) return refused("tensor " + t.name + " lies past the arena");
    if (auto bad = first_failure(payload_checksums(src, W, tensors)); !bad.empty()) return corrupt(bad);
    if (dtype == WeightDtype::bf16)
      decode_full<2>(src, values.data(), n);
    else
      decode_full<4>(src, values.data(), n);
    return {};
  }

  // Delta, in place. xor_chunks XORs the chunks `which` selects into values; run twice it restores them.
  std::vector<std::uint8_t> applied(chunks, 0);
  std::atomic<std::ptrdiff_t> bad_chunk{-1};
  float* v = values.data();
  auto xor_chunks = [&](const std::vector<std::uint8_t>* which) {
#pragma omp parallel for schedule(dynamic)
    for (std::ptrdiff_t k = 0; k < K; ++k) {
      const size_t c = static_cast<size_t>(k), a = c * C, len = std::min(C, n - a);
      if (which && !(*which)[c]) continue;
      ThreadScratch& ts = thread_scratch();
      const std::uint8_t* raw = src + at[c];
      size_t raw_size = w.chunk_bytes[c];
      if (w.chunk_format[c] & kChunkZstd) {
        const unsigned long long content = ZSTD_getFrameContentSize(raw, raw_size);
        const size_t most = bitmap_words(len) * 8 + len * W;
        if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content > most) {
          bad_chunk.store(k);
          continue;
        }
        std::uint8_t* out = ts.raw.reserve(static_cast<size_t>(content));
        const size_t r = ZSTD_decompressDCtx(ts.decompressor(), out, static_cast<size_t>(content), raw, raw_size);
        if (ZSTD_isError(r) || r != content) {
          bad_chunk.store(k);
          continue;
        }
        raw = out;
        raw_size = r;
      }
      const bool sparse = w.chunk_format[c] & kChunkSparse;
      const bool ok = dtype == WeightDtype::bf16 ? apply_chunk<2>(raw, raw_size, sparse, v + a, len)
                                                 : apply_chunk<4>(raw, raw_size, sparse, v + a, len);
      if (!ok) {
        bad_chunk.store(k);
        continue;
      }
      if (!which) applied[c] = 1;
    }
  };
  xor_chunks(nullptr);
  std::string why;
  if (bad_chunk.load() >= 0)
    why = "delta chunk " + std::to_string(bad_chunk.load()) + " of version " + std::to_string(w.version) +
          " does not decode";
  else
    why = first_failure(weight_checksums(values, tensors, dtype));
  if (!why.empty()) xor_chunks(&applied);  // back to the base version, bit for bit
  return why.empty() ? WeightsApplied{} : corrupt(why);
}

// ---- the probe ----------------------------------------------------------------------------------

std::vector<std::int32_t> probe_tokens(int vocab_size) {
  constexpr int kProbeLength = 32;
  std::vector<std::int32_t> t(kProbeLength);
  const auto V = static_cast<std::uint64_t>(std::max(1, vocab_size));
  for (int i = 0; i < kProbeLength; ++i)  // a prime stride: ids spread over the vocabulary, none repeated early
    t[static_cast<size_t>(i)] = static_cast<std::int32_t>((static_cast<std::uint64_t>(i) * 7919u + 13u) % V);
  return t;
}

Result<std::vector<float>> probe_logprobs(policy::Model& model, const std::vector<std::int32_t>& tokens) {
  if (tokens.size() < 2) return invalid_input("probe: the sequence needs two tokens at least");
  policy::PackedBatch b;
  b.tokens = tokens;
  b.cu_seqlens = {0, static_cast<std::int32_t>(tokens.size())};
  b.targets.assign(tokens.size(), -1);
  for (size_t t = 0; t + 1 < tokens.size(); ++t) b.targets[t] = tokens[t + 1];
  std::vector<float> logp(tokens.size()), entropy(tokens.size());
  TROUPE_TRY(model.forward_train(b, 1.0f, logp.data(), entropy.data()));
  logp.resize(tokens.size() - 1);
  return logp;
}

std::int64_t first_bit_difference(std::span<const float> a, std::span<const float> b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return static_cast<std::int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(n);
}

}  // namespace troupe::actors
