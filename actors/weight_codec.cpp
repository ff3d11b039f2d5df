// The weight-sync codec (weight_codec.h): generator dtypes, full and delta payloads, per-tensor
// checksums, the probe. Chunks are encoded and decoded in parallel (OpenMP, the calling role's
// threads); a delta is applied in place and undone (XOR is its own inverse) when a chunk does not
// decode or a tensor fails its checksum, so a receiver never holds a mix of two versions.
#include "troupe/actors/weight_codec.h"

#include <omp.h>
#include <xxhash.h>
#include <zstd.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>  // XXH3 with the widest vectors the CPU has (the same hashes)
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <type_traits>
#include <cstring>
#include <memory>
#include <utility>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace troupe::actors {

namespace {

// zstd levels. Sparse chunks (bf16) are about a byte of gap and two of XOR per change: a very fast
// (negative) level only finds the long runs (the XORs' high bytes are mostly zero, unchanged tensors
// are runs of gap 255) and leaves the rest as it is. For SmolLM2-135M after a step at lr 1e-6 (5.6M
// of 135M values change), per sync on one core: level -30 takes 7 ms less to compress and 4 ms
// less to decompress than level -10 for 12% more bytes (12.0 MB against 10.7; stored as is: 16.7
// MB for 5 and 1 ms less again), and level 1 makes 7.1 MB in 16 and 9 ms more than level -10.
// Dense chunks (fp32) are planes of mostly random low bytes: level 1.
constexpr int kZstdLevelSparse = -30;
constexpr int kZstdLevelDense = 1;

// Values per hash update: a block of wire values hashed while it is still in L1/L2.
constexpr size_t kHashBlock = 4096;

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
//   sparse (bf16): [u32 count of changed values, little-endian]
//                  [gaps: per changed value, the unchanged values before it since the previous one
//                   (or the chunk's start), as bytes: 255 means "255 more, go on", a byte < 255 ends it]
//                  [W byte planes of the changed values' XORs, in order: plane p holds byte p of each]
//   dense (fp32):  [W byte planes of every value's XOR]
// A small update changes few bf16 values, so zstd only sees about a byte of position and two of
// XOR per change, and the receiver only touches what changed. In fp32 a small update changes the
// low bits of nearly every value: the planes separate the XORs' zero high bytes from their random
// low ones.
constexpr std::uint8_t kChunkZstd = 1;    // a zstd frame (else stored as is)
constexpr std::uint8_t kChunkSparse = 2;  // the sparse layout (else dense)

size_t chunk_count(size_t elements, size_t chunk) { return chunk == 0 ? 0 : (elements + chunk - 1) / chunk; }
// The most bytes a sparse chunk of len values takes before zstd.
size_t sparse_bound(size_t len, size_t W) { return 4 + len * (1 + W) + len / 255 + 1; }

// 64 (or, at a chunk's end, cnt < 64) XORs -> a bit per value, set where it is nonzero.
template <class T>
inline std::uint64_t nonzero_bits(const T* d, size_t cnt) {
#if defined(__SSE2__)
  if (sizeof(T) == 2 && cnt == 64) {
    const __m128i zero = _mm_setzero_si128();
    std::uint64_t zeros = 0;
    for (int q = 0; q < 4; ++q) {  // 16 values -> 16 bits
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 16 * q));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 16 * q + 8));
      const __m128i z = _mm_packs_epi16(_mm_cmpeq_epi16(a, zero), _mm_cmpeq_epi16(b, zero));
      zeros |= static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm_movemask_epi8(z))) << (16 * q);
    }
    return ~zeros;
  }
#endif
  std::uint64_t bits = 0;
  for (size_t i = 0; i < cnt; ++i) bits |= static_cast<std::uint64_t>(d[i] != 0) << i;
  return bits;
}

// The bf16 scan at the heart of a sparse delta. Values m[0, len) are rounded to their bf16 wire
// form (into `packed`, which the checksum hashes) and compared with held; each change is written
// into held and recorded: its gap (the unchanged values since the position c.next, as bytes: 255
// means "255 more, go on") in gaps[c.g...], its XOR in xors[c.j...]. pos0 is m[0]'s position in
// its chunk.
struct SparseCursor {
  size_t g = 0, j = 0, next = 0;  // gap bytes and XORs written, the position after the last change
};
[[gnu::always_inline]] inline void record_change(size_t at, std::uint16_t x, std::uint8_t* __restrict gaps,
                                                 std::uint16_t* __restrict xors, size_t& g, size_t& j, size_t& next) {
  size_t gap = at - next;
  for (; gap >= 255; gap -= 255) gaps[g++] = 255;
  gaps[g++] = static_cast<std::uint8_t>(gap);
  xors[j++] = x;
  next = at + 1;
}
[[gnu::always_inline]] inline void sparse_scan_body(const float* __restrict m, std::uint16_t* __restrict held,
                                                    size_t len, size_t pos0, std::uint8_t* __restrict gaps,
                                                    std::uint16_t* __restrict xors, SparseCursor& c,
                                                    std::uint16_t* __restrict packed) {
  size_t g = c.g, j = c.j, next = c.next;
  for (size_t base = 0; base < len; base += 64) {
    const size_t cnt = std::min<size_t>(64, len - base);
    alignas(16) std::uint16_t d[64];
#pragma omp simd
    for (size_t i = 0; i < cnt; ++i) {
      const auto wire = static_cast<std::uint16_t>(bf16_bits(std::bit_cast<std::uint32_t>(m[base + i])) >> 16);
      packed[base + i] = wire;
      d[i] = static_cast<std::uint16_t>(wire ^ held[base + i]);
    }
    for (std::uint64_t bits = nonzero_bits(d, cnt); bits; bits &= bits - 1) {
      const size_t i = static_cast<size_t>(std::countr_zero(bits));
      held[base + i] = packed[base + i];
      record_change(pos0 + base + i, d[i], gaps, xors, g, j, next);
    }
  }
  c = {g, j, next};
}
// The same scan compiled for AVX2 too (the rounding and compares take twice the values per
// instruction), picked at run time. (A hand-written AVX2 version, 16 values a step with the change
// test per step, was 1.5x faster on data in cache but 10-20% slower in the bench's real passes.)
void sparse_scan_generic(const float* m, std::uint16_t* held, size_t len, size_t pos0, std::uint8_t* gaps,
                         std::uint16_t* xors, SparseCursor& c, std::uint16_t* packed) {
  sparse_scan_body(m, held, len, pos0, gaps, xors, c, packed);
}
#if defined(__x86_64__)
__attribute__((target("avx2,bmi,bmi2"))) void sparse_scan_avx2(const float* m, std::uint16_t* held, size_t len,
                                                                 size_t pos0, std::uint8_t* gaps, std::uint16_t* xors,
                                                                 SparseCursor& c, std::uint16_t* packed) {
  sparse_scan_body(m, held, len, pos0, gaps, xors, c, packed);
}
#endif
void sparse_scan(const float* m, std::uint16_t* held, size_t len, size_t pos0, std::uint8_t* gaps,
                 std::uint16_t* xors, SparseCursor& c, std::uint16_t* packed) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  if (avx2) return sparse_scan_avx2(m, held, len, pos0, gaps, xors, c, packed);
#endif
  sparse_scan_generic(m, held, len, pos0, gaps, xors, c, packed);
}

// The sparse layout around gaps already at raw + 4 (G bytes): the count before them, the j XORs'
// byte planes after them. Returns the layout's bytes.
size_t finish_sparse(std::uint8_t* __restrict raw, size_t G, const std::uint16_t* __restrict xors, size_t j) {
  const auto count = static_cast<std::uint32_t>(j);
  std::memcpy(raw, &count, 4);
  std::uint8_t* planes = raw + 4 + G;
#pragma omp simd
  for (size_t i = 0; i < j; ++i) {
    planes[i] = static_cast<std::uint8_t>(xors[i]);
    planes[j + i] = static_cast<std::uint8_t>(xors[i] >> 8);
  }
  return 4 + G + 2 * j;
}

// Sparse (bf16): held becomes the new values (only the changed ones are written); `raw` gets the
// sparse layout, `xors` the changed values' XORs on the way. Returns how many changed; *raw_size
// its bytes. With st, the new values (wire form) are hashed into it, a block at a time in cache.
size_t encode_sparse(const float* m, std::uint16_t* held, size_t len, std::uint8_t* raw, std::uint16_t* xors,
                     size_t* raw_size, XXH3_state_t* st) {
  std::uint8_t* gaps = raw + 4;
  SparseCursor c;
  alignas(64) std::uint16_t packed[kHashBlock];
  for (size_t a = 0; a < len; a += kHashBlock) {
    const size_t n = std::min(kHashBlock, len - a);
    sparse_scan(m + a, held + a, n, a, gaps, xors, c, packed);
    if (st) XXH3_64bits_update(st, packed, n * 2);
  }
  *raw_size = finish_sparse(raw, c.g, xors, c.j);
  return c.j;
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
// Dense: held becomes the new values; x gets every value's XOR. Returns how many changed. With
// st, the new values are hashed into it as they go.
template <int W>
size_t encode_dense(const float* __restrict m, WireT<W>* __restrict held, size_t len, std::uint32_t* __restrict x,
                    XXH3_state_t* st) {
  size_t changed = 0;
  for (size_t b = 0; b < len; b += kHashBlock) {
    const size_t e = std::min(len, b + kHashBlock);
#pragma omp simd reduction(+ : changed)
    for (size_t i = b; i < e; ++i) {
      const auto wire = static_cast<WireT<W>>(to_wire<W>(to_dtype_bits<W>(std::bit_cast<std::uint32_t>(m[i]))));
      x[i] = static_cast<std::uint32_t>(wire ^ held[i]);
      changed += x[i] != 0;
      held[i] = wire;
    }
    if (st) XXH3_64bits_update(st, held + b, (e - b) * W);
  }
  return changed;
}
template <int W>
inline std::uint32_t join_planes(const std::uint8_t* planes, size_t n, size_t i) {
  std::uint32_t d = 0;
  for (int p = 0; p < W; ++p) d |= static_cast<std::uint32_t>(planes[static_cast<size_t>(p) * n + i]) << (8 * p);
  return d;
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
  Buffer raw;   // a chunk's bytes before zstd (gaps and planes, or planes)
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  XXH3_state_t* hash = nullptr;  // a tensor's checksum, hashed as its chunks go
  ~ThreadScratch() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
    XXH3_freeState(hash);
  }
  XXH3_state_t* hasher() { return hash ? hash : (hash = XXH3_createState()); }
  ZSTD_CCtx* compressor() { return cctx ? cctx : (cctx = ZSTD_createCCtx()); }
  ZSTD_DCtx* decompressor() { return dctx ? dctx : (dctx = ZSTD_createDCtx()); }
};
ThreadScratch& thread_scratch() {
  thread_local ThreadScratch s;
  return s;
}

}  // namespace

WeightDtype weight_dtype_of(const std::string& name) { return enum_from_name<WeightDtype>(name).value_or(WeightDtype::fp32); }
const char* weight_dtype_name(WeightDtype d) { return enum_name(d).data(); }
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
// Hashes n values in wire form (W bytes each: fp32 as they are, bf16 their high halves) into st.
[[gnu::always_inline]] inline void hash_values(XXH3_state_t* st, const float* v, size_t n, size_t W) {
  if (W == 4) {
    XXH3_64bits_update(st, v, n * 4);
    return;
  }
  std::uint16_t packed[kHashBlock];
  for (size_t a = 0; a < n; a += kHashBlock) {
    const size_t len = std::min(kHashBlock, n - a);
#pragma omp simd
    for (size_t i = 0; i < len; ++i) packed[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v[a + i]) >> 16);
    XXH3_64bits_update(st, packed, len * 2);
  }
}

std::uint64_t wire_hash(const float* v, size_t n, WeightDtype dtype) {
  if (dtype != WeightDtype::bf16) return XXH3_64bits(v, n * sizeof(float));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  hash_values(st, v, n, 2);
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

// ---- chunks and tensors ------------------------------------------------------------------------

namespace {

// The values of a delta are cut into chunks (each compressed and decoded on one thread). When the
// tensor table tiles the arena (every value in exactly one tensor, as a dense model's does), each
// tensor is cut into chunks of its own, and a tensor's chunks are encoded (and applied) by one
// thread in order, which hashes the tensor in the same pass over its values: memory is read once.
// Otherwise the chunks cut the arena evenly and the checksums are a pass of their own.
struct ChunkPlan {
  std::vector<size_t> start;  // per chunk, its first value; a sentinel n at the end
  struct Unit {
    size_t tensor, first, last;  // tensor index, chunks [first, last)
  };
  std::vector<Unit> units;  // empty: the table does not tile the arena (no fused hashing)
  size_t chunks() const { return start.empty() ? 0 : start.size() - 1; }
};

// Tensor indices by offset when they tile [0, n) exactly; empty otherwise.
std::vector<size_t> tiling_order(const std::vector<policy::TensorSpec>& tensors, size_t n) {
  std::vector<size_t> order(tensors.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return tensors[x].offset < tensors[y].offset; });
  size_t at = 0;
  for (size_t t : order) {
    if (tensors[t].offset != at) return {};
    at += tensors[t].numel();
  }
  if (at != n) return {};
  return order;
}

// The units over given chunk starts: each tensor's chunks, when every chunk lies inside one tensor
// and the tensors tile the arena; the largest first (the dynamic schedule then balances them).
std::vector<ChunkPlan::Unit> units_of(const std::vector<policy::TensorSpec>& tensors, const std::vector<size_t>& start,
                                      size_t n) {
  const auto order = tiling_order(tensors, n);
  if (order.empty() && n > 0) return {};
  std::vector<ChunkPlan::Unit> units;
  size_t c = 0;
  const size_t chunks = start.size() - 1;
  for (size_t t : order) {
    const size_t lo = tensors[t].offset, hi = lo + tensors[t].numel();
    if (hi == lo) continue;
    if (c >= chunks || start[c] != lo) return {};
    const size_t first = c;
    while (c < chunks && start[c + 1] <= hi) ++c;
    if (start[c] != hi) return {};  // a chunk crosses the tensor's end
    units.push_back({t, first, c});
  }
  std::stable_sort(units.begin(), units.end(),
                   [&](const auto& x, const auto& y) { return start[x.last] - start[x.first] > start[y.last] - start[y.first]; });
  return units;
}

// The encoder's plan: per tensor chunks of at most C values when the table tiles the arena, else
// chunks of C over the arena.
ChunkPlan plan_chunks(const std::vector<policy::TensorSpec>& tensors, size_t n, size_t C) {
  ChunkPlan plan;
  const auto order = tiling_order(tensors, n);
  if (!order.empty()) {
    for (size_t t : order)
      for (size_t a = 0, len = tensors[t].numel(); a < len; a += C) plan.start.push_back(tensors[t].offset + a);
  } else {
    for (size_t a = 0; a < n; a += C) plan.start.push_back(a);
  }
  plan.start.push_back(n);
  if (!order.empty()) plan.units = units_of(tensors, plan.start, n);
  return plan;
}


// The receiver's walk over one sparse chunk's changes, resumable: apply_until(end) XORs the
// changes at positions < end into v (the chunk's first value). `bad` when the gaps lead outside
// the chunk or run out.
template <int W>
struct SparseWalk {
  const std::uint8_t* gaps = nullptr;
  const std::uint8_t* planes = nullptr;
  size_t G = 0, count = 0, len = 0;
  size_t g = 0, j = 0, next = 0, at = 0;
  bool have = false, bad = false;
  bool open(const std::uint8_t* raw, size_t raw_size, size_t chunk_len) {
    len = chunk_len;
    if (raw_size < 4) return false;
    std::uint32_t c;
    std::memcpy(&c, raw, 4);
    count = c;
    if (count > len || raw_size < 4 + count * (1 + W)) return false;
    gaps = raw + 4;
    G = raw_size - 4 - count * W;
    planes = gaps + G;
    return true;
  }
  void apply_until(float* __restrict v, size_t end, size_t most = SIZE_MAX) {
    while (j < count && j < most) {
      if (!have) {
        size_t gap = 0;
        while (g < G && gaps[g] == 255) gap += 255, ++g;
        if (g == G) {
          bad = true;
          return;
        }
        gap += gaps[g++];
        at = next + gap;
        if (at >= len) {
          bad = true;
          return;
        }
        have = true;
      }
      if (at >= end) return;
      std::uint32_t d = 0;
      for (int p = 0; p < W; ++p) d |= static_cast<std::uint32_t>(planes[static_cast<size_t>(p) * count + j]) << (8 * p);
      v[at] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v[at]) ^ from_wire<W>(d));
      next = at + 1;
      ++j;
      have = false;
    }
  }
  bool complete() const { return !bad && j == count && g == G; }
};

// XORs one chunk's raw bytes into v (run twice, it restores them). False (and v as it was) when
// the bytes do not have the size or the content their layout says.
template <int W>
bool apply_chunk(const std::uint8_t* __restrict raw, size_t raw_size, bool sparse, float* __restrict v, size_t len) {
  if (!sparse) {
    if (raw_size != len * W) return false;
#pragma omp simd
    for (size_t i = 0; i < len; ++i)
      v[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v[i]) ^ from_wire<W>(join_planes<W>(raw, len, i)));
    return true;
  }
  SparseWalk<W> walk;
  if (!walk.open(raw, raw_size, len)) return false;
  walk.apply_until(v, len);
  if (walk.complete()) return true;
  SparseWalk<W> undo;  // back as they were
  undo.open(raw, raw_size, len);
  undo.apply_until(v, len, walk.j);
  return false;
}

// The same, with the chunk's values hashed into st as it goes (block by block, each while in cache).
template <int W>
[[gnu::always_inline]] inline bool apply_chunk_hashed_body(const std::uint8_t* __restrict raw, size_t raw_size,
                                                           bool sparse, float* __restrict v, size_t len,
                                                           XXH3_state_t* st) {
  if (!sparse) {
    if (raw_size != len * W) return false;
    for (size_t b = 0; b < len; b += kHashBlock) {
      const size_t e = std::min(len, b + kHashBlock);
#pragma omp simd
      for (size_t i = b; i < e; ++i)
        v[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v[i]) ^ from_wire<W>(join_planes<W>(raw, len, i)));
      hash_values(st, v + b, e - b, W);
    }
    return true;
  }
  SparseWalk<W> walk;
  if (!walk.open(raw, raw_size, len)) return false;
  for (size_t b = 0; b < len && !walk.bad; b += kHashBlock) {
    const size_t e = std::min(len, b + kHashBlock);
    walk.apply_until(v, e);
    hash_values(st, v + b, e - b, W);
  }
  if (walk.complete()) return true;
  SparseWalk<W> undo;
  undo.open(raw, raw_size, len);
  undo.apply_until(v, len, walk.j);
  return false;
}
// (compiled for AVX2 too, as encode_sparse)
#if defined(__x86_64__)
template <int W>
__attribute__((target("avx2,bmi,bmi2"))) bool apply_chunk_hashed_avx2(const std::uint8_t* raw, size_t raw_size,
                                                                        bool sparse, float* v, size_t len,
                                                                        XXH3_state_t* st) {
  return apply_chunk_hashed_body<W>(raw, raw_size, sparse, v, len, st);
}
#endif
template <int W>
bool apply_chunk_hashed(const std::uint8_t* raw, size_t raw_size, bool sparse, float* v, size_t len,
                        XXH3_state_t* st) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  if (avx2) return apply_chunk_hashed_avx2<W>(raw, raw_size, sparse, v, len, st);
#endif
  return apply_chunk_hashed_body<W>(raw, raw_size, sparse, v, len, st);
}

// A chunk's raw bytes: decompressed into the thread's scratch when it is a zstd frame. Null when
// it does not decode to at most `most` bytes.
const std::uint8_t* chunk_raw(const std::uint8_t* src, size_t bytes, bool zstd, size_t most, size_t* raw_size) {
  if (!zstd) {
    *raw_size = bytes;
    return src;
  }
  const unsigned long long content = ZSTD_getFrameContentSize(src, bytes);
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content > most) return nullptr;
  ThreadScratch& ts = thread_scratch();
  std::uint8_t* out = ts.raw.reserve(static_cast<size_t>(content));
  const size_t r = ZSTD_decompressDCtx(ts.decompressor(), out, static_cast<size_t>(content), src, bytes);
  if (ZSTD_isError(r) || r != content) return nullptr;
  *raw_size = r;
  return out;
}

}  // namespace

// ---- learner 0: encoding ----------------------------------------------------------------------

namespace {

// A payload's memory, which the encoder writes again for a later message once no message points
// into it any more (a message's Bytes hold a reference while they live). A fresh allocation for
// every message costs page faults: 0.13 s for a 269 MB full payload on the bench's VM.
class PayloadBuffer final : public runtime::SharedBuffer {
 public:
  explicit PayloadBuffer(size_t n) : data_(new char[n]), capacity_(n) {}  // (not zero-filled)
  char* data() { return data_.get(); }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t capacity_;
};

// One reusable buffer per kind of payload (full, delta).
class PayloadPool {
 public:
  enum Kind { kFull = 0, kDelta = 1 };
  PayloadPool() = default;
  PayloadPool(const PayloadPool&) = delete;
  PayloadPool& operator=(const PayloadPool&) = delete;
  ~PayloadPool() {
    for (auto* b : slot_)
      if (b) b->release();
  }
  // A buffer of at least n bytes that no message uses (the kept one, or a new one in its place).
  PayloadBuffer* take(Kind kind, size_t n) {
    PayloadBuffer*& b = slot_[kind];
    if (b && (b->use_count() != 1 || b->capacity() < n)) {
      b->release();  // (a message still using it keeps it alive until it is done)
      b = nullptr;
    }
    if (!b) b = new PayloadBuffer(kind == kDelta ? n + n / 4 : n);  // deltas vary: some headroom
    return b;
  }

 private:
  PayloadBuffer* slot_[2] = {nullptr, nullptr};
};

}  // namespace

struct WeightEncoder::Frames {
  std::vector<Buffer> chunk;  // per chunk: its compressed frame (or its raw bytes, stored as they are)
  ChunkPlan plan;             // (made for the arena's size on first use)
  size_t planned_for = SIZE_MAX;
  PayloadPool payloads;       // the messages' payload memory, reused
  // The delta chunks' plan for an arena of n values (made once per size).
  const ChunkPlan& plan_for(const std::vector<policy::TensorSpec>& tensors, size_t n) {
    if (planned_for != n) {
      plan = plan_chunks(tensors, n, kWeightChunkElements);
      planned_for = n;
    }
    return plan;
  }
};

namespace {

// A growing array of trivially copyable T that keeps its memory between steps (not
// value-initialized: every element used is written first).
template <class T>
struct GrowBuffer {
  std::unique_ptr<T[]> data;
  size_t capacity = 0, size = 0;
  T* room_for(size_t more) {  // room for `more` past size; the pointer is to data[size]
    if (size + more > capacity) {
      const size_t cap = std::max(size + more, capacity + capacity / 2);
      std::unique_ptr<T[]> grown(new T[cap]);
      if (size) std::memcpy(grown.get(), data.get(), size * sizeof(T));
      data = std::move(grown);
      capacity = cap;
    }
    return data.get() + size;
  }
};

// One chunk's changes as a step prepared them: the sparse layout's gaps, the changed values' XORs
// (wire form) and the position after the last change (where the next gap counts from).
struct PreparedChunk {
  GrowBuffer<std::uint8_t> gaps;
  GrowBuffer<std::uint16_t> xors;
  size_t next = 0;
  void clear() { gaps.size = xors.size = next = 0; }
};

// master[b, e) (a piece of one chunk starting at chunk_start) scanned against held (sparse_scan):
// the changes go into pc, the new wire values into the checksum st. The same gaps, XORs and hash
// as encode_sparse over the chunk.
void prepare_piece(const float* m, std::uint16_t* held, size_t b, size_t e, size_t chunk_start, PreparedChunk& pc,
                   XXH3_state_t* st) {
  alignas(64) std::uint16_t packed[kHashBlock];
  for (size_t a = b; a < e; a += kHashBlock) {
    const size_t len = std::min(kHashBlock, e - a);
    // a byte per change, and the 255s of the gaps since the chunk's last change (before this piece too)
    std::uint8_t* gaps = pc.gaps.room_for(len + (a + len - chunk_start - pc.next) / 255 + 1);
    std::uint16_t* xors = pc.xors.room_for(len);
    SparseCursor c{0, 0, pc.next};
    sparse_scan(m + a, held + a, len, a - chunk_start, gaps, xors, c, packed);
    pc.gaps.size += c.g;
    pc.xors.size += c.j;
    pc.next = c.next;
    XXH3_64bits_update(st, packed, len * 2);
  }
}

// Calls fn(position in the arena, XOR) for each recorded change, the chunks on the OpenMP threads.
template <class Fn>
void for_each_change(const std::vector<PreparedChunk>& chunks, const ChunkPlan& plan, Fn&& fn) {
  const auto K = static_cast<std::ptrdiff_t>(chunks.size());
#pragma omp parallel for schedule(dynamic)
  for (std::ptrdiff_t k = 0; k < K; ++k) {
    const PreparedChunk& pc = chunks[static_cast<size_t>(k)];
    size_t g = 0, next = plan.start[static_cast<size_t>(k)];
    for (size_t j = 0; j < pc.xors.size; ++j) {
      size_t gap = 0;
      while (pc.gaps.data[g] == 255) gap += 255, ++g;
      gap += pc.gaps.data[g++];
      fn(next + gap, pc.xors.data[j]);
      next += gap + 1;
    }
  }
}

}  // namespace

struct WeightEncoder::Prepared {
  enum class State { none, preparing, ready };
  State state = State::none;
  size_t n = 0;
  std::vector<std::pair<size_t, size_t>> ranges;  // per unit of the plan: its tensor's values
  std::vector<size_t> cursor;                      // per unit: the chunk its next block is in
  std::vector<PreparedChunk> chunks;               // per chunk of the plan
  std::vector<XXH3_state_t*> hash;                 // per unit
  std::vector<std::uint64_t> checksums;            // per tensor, of the step's values
  std::int64_t encodes = 0;
  void reset() {  // nothing prepared (the caller has dealt with held)
    for (auto& c : chunks) c.clear();
    state = State::none;
  }
  ~Prepared() {
    for (auto* h : hash) XXH3_freeState(h);
  }
};

WeightEncoder::WeightEncoder(WeightDtype dtype, std::vector<policy::TensorSpec> tensors)
    : dtype_(dtype),
      tensors_(std::move(tensors)),
      frames_(std::make_unique<Frames>()),
      prepared_(std::make_unique<Prepared>()) {}
WeightEncoder::~WeightEncoder() = default;

std::span<const std::pair<size_t, size_t>> WeightEncoder::begin_prepare(size_t n) {
  Prepared& p = *prepared_;
  if (p.state != Prepared::State::none) undo_prepared();  // a second step: against the same base again
  if (dtype_ != WeightDtype::bf16 || held_version_ < 0 || held16_.size() != n) return {};
  const ChunkPlan& plan = frames_->plan_for(tensors_, n);
  if (plan.units.empty()) return {};
  if (p.n != n || p.ranges.size() != plan.units.size()) {
    p.n = n;
    p.ranges.clear();
    for (const auto& u : plan.units) p.ranges.emplace_back(plan.start[u.first], plan.start[u.last]);
    p.chunks = std::vector<PreparedChunk>(plan.chunks());
    for (auto* h : p.hash) XXH3_freeState(h);
    p.hash.assign(plan.units.size(), nullptr);
    for (auto*& h : p.hash) h = XXH3_createState();
  }
  p.cursor.resize(plan.units.size());
  for (size_t u = 0; u < plan.units.size(); ++u) {
    p.cursor[u] = plan.units[u].first;
    XXH3_64bits_reset(p.hash[u]);
  }
  p.state = Prepared::State::preparing;
  return p.ranges;
}

void WeightEncoder::prepare_block(size_t range, size_t begin, size_t end, const float* master) {
  Prepared& p = *prepared_;
  const ChunkPlan& plan = frames_->plan;
  size_t& c = p.cursor[range];
  while (begin < end) {
    while (plan.start[c + 1] <= begin) ++c;  // the chunk holding `begin` (blocks come in order)
    const size_t e = std::min(end, plan.start[c + 1]);
    prepare_piece(master, held16_.data(), begin, e, plan.start[c], p.chunks[c], p.hash[range]);
    begin = e;
  }
}

void WeightEncoder::end_prepare() {
  Prepared& p = *prepared_;
  if (p.state != Prepared::State::preparing) return;
  const ChunkPlan& plan = frames_->plan;
  p.checksums.assign(tensors_.size(), XXH3_64bits(nullptr, 0));  // (a tensor of no values is in no unit)
  for (size_t u = 0; u < plan.units.size(); ++u) p.checksums[plan.units[u].tensor] = XXH3_64bits_digest(p.hash[u]);
  p.state = Prepared::State::ready;
}

bool WeightEncoder::has_prepared() const { return prepared_->state == Prepared::State::ready; }
std::int64_t WeightEncoder::prepared_encodes() const { return prepared_->encodes; }

void WeightEncoder::discard_prepared() {
  if (prepared_->state != Prepared::State::none) undo_prepared();
}

void WeightEncoder::undo_prepared() {
  std::uint16_t* held = held16_.data();
  for_each_change(prepared_->chunks, frames_->plan, [held](size_t at, std::uint16_t x) { held[at] ^= x; });
  prepared_->reset();
}

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
  bool from_prepared = false;
  if constexpr (W == 2) {  // a step's prepared delta: held already holds its values
    Prepared& p = *prepared_;
    from_prepared = delta && p.state == Prepared::State::ready && p.n == n;
    if (!from_prepared && p.state != Prepared::State::none) {
      if (delta) {
        undo_prepared();
      } else {  // a full encoding rewrites all of held
        p.reset();
      }
    }
  }
  if (held_wire.size() != n) held_wire.assign(n, 0);
  out = Weights{};
  out.version = version;
  out.base_version = delta ? held_version_ : -1;
  out.encoding = static_cast<std::int32_t>(delta ? WeightEncoding::delta : WeightEncoding::full);
  out.dtype = static_cast<std::int32_t>(dtype_);
  out.elements = n;
  out.chunk_elements = C;
  WireT<W>* held = held_wire.data();
  const float* m = master.data();
  if (!delta) {
    // Full: every value's wire bits, element after element, uncompressed (most bits of a weight are noise).
    const size_t chunks = chunk_count(n, C);
    out.chunk_bytes.assign(chunks, 0);
    out.chunk_format.assign(chunks, 0);
    PayloadBuffer* buf = frames_->payloads.take(PayloadPool::kFull, n * W);
    encode_full<W>(m, held, reinterpret_cast<std::uint8_t*>(buf->data()), n);
    out.payload = runtime::Bytes::shared(buf, buf->data(), n * W);
    for (size_t c = 0; c < chunks; ++c) out.chunk_bytes[c] = std::min(C, n - c * C) * W;
    held_version_ = version;
    // the held wire form is exactly what the checksums cover, and the payload
    out.checksums = payload_checksums(reinterpret_cast<const std::uint8_t*>(held), W, tensors_);
    return;
  }
  // Delta: per chunk, the gaps between changed values and their XORs' byte planes (bf16: few
  // change), or the planes of every value's XOR (fp32: nearly all change), then zstd.
  const ChunkPlan& plan = frames_->plan_for(tensors_, n);
  const size_t chunks = plan.chunks();
  out.chunk_bytes.assign(chunks, 0);
  out.chunk_format.assign(chunks, 0);
  out.chunk_starts.assign(plan.start.begin(), plan.start.end() - 1);
  constexpr bool sparse = W == 2;
  auto& frames = frames_->chunk;
  frames.resize(chunks);
  const bool fused = !plan.units.empty();
  if (fused) out.checksums.assign(tensors_.size(), 0);
  // frames[c]: chunk c's raw bytes, compressed (or as they are when that does not make them shorter).
  auto seal = [&](size_t c, const std::uint8_t* raw, size_t raw_size) {
    ThreadScratch& ts = thread_scratch();
    out.chunk_format[c] = sparse ? kChunkSparse : 0;
    Buffer& f = frames[c];
    const size_t bound = ZSTD_compressBound(raw_size);
    std::uint8_t* dst = f.reserve(bound);
    const size_t z = ZSTD_compressCCtx(ts.compressor(), dst, bound, raw, raw_size, sparse ? kZstdLevelSparse : kZstdLevelDense);
    if (ZSTD_isError(z) || z >= raw_size) {
      std::memcpy(dst, raw, raw_size);  // incompressible: stored as is
      f.size = raw_size;
    } else {
      f.size = z;
      out.chunk_format[c] |= kChunkZstd;
    }
  };
  // One chunk: held becomes the new values, frames[c] its frame; hashed into st when given.
  auto encode_chunk = [&](size_t c, XXH3_state_t* st) -> size_t {
    ThreadScratch& ts = thread_scratch();
    const size_t a = plan.start[c], len = plan.start[c + 1] - a;
    size_t ch = 0, raw_size = 0;
    std::uint8_t* raw = ts.raw.reserve(sparse ? sparse_bound(len, W) : len * W);
    auto* x = reinterpret_cast<std::uint32_t*>(ts.xors.reserve(len * 4));
    if constexpr (sparse) {
      ch = encode_sparse(m + a, held + a, len, raw, reinterpret_cast<std::uint16_t*>(x), &raw_size, st);
    } else {
      ch = encode_dense<W>(m + a, held + a, len, x, st);
      raw_size = len * W;
      split_planes<W>(x, len, raw);
    }
    seal(c, raw, raw_size);
    return ch;
  };
  std::uint64_t changed = 0;
  if (from_prepared) {  // the step did the reading, comparing and hashing: the same layout from its record
    if constexpr (W == 2) {
      Prepared& p = *prepared_;
      const auto K = static_cast<std::ptrdiff_t>(chunks);
#pragma omp parallel for schedule(dynamic) reduction(+ : changed)
      for (std::ptrdiff_t k = 0; k < K; ++k) {
        const auto c = static_cast<size_t>(k);
        const PreparedChunk& pc = p.chunks[c];
        const size_t j = pc.xors.size, G = pc.gaps.size;
        std::uint8_t* raw = thread_scratch().raw.reserve(4 + G + 2 * j);
        if (G) std::memcpy(raw + 4, pc.gaps.data.get(), G);
        seal(c, raw, finish_sparse(raw, G, pc.xors.data.get(), j));
        changed += j;
      }
      out.checksums = p.checksums;
      p.reset();
      ++p.encodes;
    }
  } else if (fused) {
    const auto U = static_cast<std::ptrdiff_t>(plan.units.size());
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : changed)
    for (std::ptrdiff_t u = 0; u < U; ++u) {
      const auto& unit = plan.units[static_cast<size_t>(u)];
      XXH3_state_t* st = thread_scratch().hasher();
      XXH3_64bits_reset(st);
      for (size_t c = unit.first; c < unit.last; ++c) changed += encode_chunk(c, st);
      out.checksums[unit.tensor] = XXH3_64bits_digest(st);
    }
  } else {
    const auto K = static_cast<std::ptrdiff_t>(chunks);
#pragma omp parallel for schedule(dynamic) reduction(+ : changed)
    for (std::ptrdiff_t k = 0; k < K; ++k) changed += encode_chunk(static_cast<size_t>(k), nullptr);
  }
  size_t total = 0;
  for (size_t c = 0; c < chunks; ++c) total += (out.chunk_bytes[c] = frames[c].size);
  PayloadBuffer* buf = frames_->payloads.take(PayloadPool::kDelta, total);
  size_t at = 0;
  for (size_t c = 0; c < chunks; ++c) {
    std::memcpy(buf->data() + at, frames[c].data.get(), frames[c].size);
    at += frames[c].size;
  }
  out.payload = runtime::Bytes::shared(buf, buf->data(), total);
  out.changed = changed;
  held_version_ = version;
  // the held wire form is exactly what the checksums cover
  if (from_prepared) return;
  if (!fused) out.checksums = payload_checksums(reinterpret_cast<const std::uint8_t*>(held), W, tensors_);
  else  // a tensor of no values is in no unit
    for (size_t t = 0; t < tensors_.size(); ++t)
      if (tensors_[t].numel() == 0) out.checksums[t] = XXH3_64bits(nullptr, 0);
}

void WeightEncoder::held_into(std::span<float> out) const {
  const auto n = static_cast<std::ptrdiff_t>(std::min(out.size(), dtype_ == WeightDtype::bf16 ? held16_.size() : held32_.size()));
  float* o = out.data();
  if (dtype_ == WeightDtype::bf16) {
    const std::uint16_t* h = held16_.data();
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; ++i) o[i] = std::bit_cast<float>(static_cast<std::uint32_t>(h[i]) << 16);
    // While a step's delta is prepared, held16_ holds its values: the base is them XOR its changes.
    const Prepared& p = *prepared_;
    if (p.state != Prepared::State::none && out.size() == held16_.size())
      for_each_change(p.chunks, frames_->plan, [o](size_t at, std::uint16_t x) {
        o[at] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(o[at]) ^ (static_cast<std::uint32_t>(x) << 16));
      });
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
  for (const auto& t : tensors)
    if (t.offset + t.numel() > values.size()) return refused("tensor " + t.name + " lies past the arena");
  const size_t n = values.size(), W = width_of(dtype), C = w.chunk_elements;
  if (C == 0 && n > 0) return corrupt("chunk_elements is 0");
  // Chunk starts: given (a delta's chunks follow the tensors), else every C values.
  std::vector<size_t> start;
  if (!w.chunk_starts.empty()) {
    if (enc != WeightEncoding::delta) return corrupt("a full payload with chunk starts");
    start.assign(w.chunk_starts.begin(), w.chunk_starts.end());
    for (size_t c = 0; c < start.size(); ++c) {
      const size_t end = c + 1 < start.size() ? start[c + 1] : n;
      if ((c == 0 && start[c] != 0) || start[c] >= end || end > n || end - start[c] > C)
        return corrupt("delta chunk " + std::to_string(c) + " spans values [" + std::to_string(start[c]) + ", " +
                       std::to_string(end) + "): not where the previous one ends (0 for the first), empty, past the arena's " +
                       std::to_string(n) + " values or longer than chunk_elements (" + std::to_string(C) + ")");
    }
  } else {
    for (size_t a = 0; a < n; a += C) start.push_back(a);
  }
  start.push_back(n);
  const size_t chunks = start.size() - 1;
  if (w.chunk_bytes.size() != chunks || w.chunk_format.size() != chunks)
    return corrupt(std::to_string(w.chunk_bytes.size()) + " chunks for " + std::to_string(n) + " values in " +
                   std::to_string(chunks) + " chunks");
  std::vector<size_t> at(chunks + 1, 0);
  for (size_t c = 0; c < chunks; ++c) at[c + 1] = at[c] + w.chunk_bytes[c];
  if (at[chunks] != w.payload.size())
    return corrupt("the chunks add up to " + std::to_string(at[chunks]) + " bytes, the payload has " +
                   std::to_string(w.payload.size()));
  const auto K = static_cast<std::ptrdiff_t>(chunks);
  const auto* src = reinterpret_cast<const std::uint8_t*>(w.payload.data());

  auto first_failure = [&](const std::vector<std::uint64_t>& sums) -> std::string {
    for (size_t t = 0; t < tensors.size(); ++t)
      if (sums[t] != w.checksums[t])
        return "tensor " + tensors[t].name + " fails its checksum after version " + std::to_string(w.version) +
               (enc == WeightEncoding::delta ? " was applied to base version " + std::to_string(w.base_version) : "");
    return {};
  };

  if (enc == WeightEncoding::full) {
    for (size_t c = 0; c < chunks; ++c)
      if (w.chunk_format[c] != 0 || w.chunk_bytes[c] != (start[c + 1] - start[c]) * W)
        return corrupt("full chunk " + std::to_string(c) + " has " + std::to_string(w.chunk_bytes[c]) + " bytes");
    // The checksums are of the wire form, which a full payload is: checked before a value is written.
    if (auto bad = first_failure(payload_checksums(src, W, tensors)); !bad.empty()) return corrupt(bad);
    if (dtype == WeightDtype::bf16)
      decode_full<2>(src, values.data(), n);
    else
      decode_full<4>(src, values.data(), n);
    return {};
  }

  // Delta, in place. One chunk: decoded and XORed into values (hashed into st when given); run
  // twice it restores them. False when it does not decode.
  float* v = values.data();
  auto xor_chunk = [&](size_t c, XXH3_state_t* st) {
    const size_t a = start[c], len = start[c + 1] - a;
    const bool sparse = w.chunk_format[c] & kChunkSparse;
    const size_t most = sparse ? sparse_bound(len, W) : len * W;
    size_t raw_size = 0;
    const std::uint8_t* raw = chunk_raw(src + at[c], w.chunk_bytes[c], w.chunk_format[c] & kChunkZstd, most, &raw_size);
    if (!raw) return false;
    if (st)
      return dtype == WeightDtype::bf16 ? apply_chunk_hashed<2>(raw, raw_size, sparse, v + a, len, st)
                                        : apply_chunk_hashed<4>(raw, raw_size, sparse, v + a, len, st);
    return dtype == WeightDtype::bf16 ? apply_chunk<2>(raw, raw_size, sparse, v + a, len)
                                      : apply_chunk<4>(raw, raw_size, sparse, v + a, len);
  };
  std::vector<std::uint8_t> applied(chunks, 0);
  std::atomic<std::ptrdiff_t> bad_chunk{-1};
  // Each tensor's chunks on one thread, hashed as they are applied, when the chunks follow the
  // tensors; else every chunk, then the checksums in a pass of their own.
  const auto units = units_of(tensors, start, n);
  std::vector<std::uint64_t> sums;
  if (!units.empty()) {
    sums.assign(tensors.size(), 0);
    for (size_t t = 0; t < tensors.size(); ++t)
      if (tensors[t].numel() == 0) sums[t] = XXH3_64bits(nullptr, 0);
    const auto U = static_cast<std::ptrdiff_t>(units.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (std::ptrdiff_t u = 0; u < U; ++u) {
      const auto& unit = units[static_cast<size_t>(u)];
      XXH3_state_t* st = thread_scratch().hasher();
      XXH3_64bits_reset(st);
      bool ok = true;
      for (size_t c = unit.first; c < unit.last && ok; ++c) {
        ok = xor_chunk(c, st);
        if (ok) applied[c] = 1;
        else bad_chunk.store(static_cast<std::ptrdiff_t>(c));
      }
      sums[unit.tensor] = XXH3_64bits_digest(st);
    }
  } else {
#pragma omp parallel for schedule(dynamic)
    for (std::ptrdiff_t k = 0; k < K; ++k) {
      if (xor_chunk(static_cast<size_t>(k), nullptr)) applied[static_cast<size_t>(k)] = 1;
      else bad_chunk.store(k);
    }
  }
  std::string why;
  if (bad_chunk.load() >= 0)
    why = "delta chunk " + std::to_string(bad_chunk.load()) + " of version " + std::to_string(w.version) +
          " does not decode";
  else
    why = first_failure(units.empty() ? weight_checksums(values, tensors, dtype) : sums);
  if (!why.empty()) {  // back to the base version, bit for bit
#pragma omp parallel for schedule(dynamic)
    for (std::ptrdiff_t k = 0; k < K; ++k)
      if (applied[static_cast<size_t>(k)]) (void)xor_chunk(static_cast<size_t>(k), nullptr);
  }
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
