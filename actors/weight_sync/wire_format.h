// The codec's wire form and chunk layout (internal to actors/weight_sync/): a value's wire bits per
// generator dtype (bf16: the high half of its rounded bits; fp32: all of them), the chunk flags and
// bounds, the chunk plan that makes each tensor's chunks one unit, and the per-thread scratch.
// Encoder and decoder both follow these definitions, so a payload means the same on both sides.
#pragma once

#include <xxhash.h>
#include <zstd.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>  // XXH3 with the widest vectors the CPU has (the same hashes)
#endif

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "troupe/actors/weight_format.h"
#include "troupe/policy/model.h"

namespace troupe::actors::codec {

// zstd levels. Sparse chunks (bf16) are about a byte of gap and two of XOR per change: a very fast
// (negative) level only finds the long runs (the XORs' high bytes are mostly zero, unchanged tensors
// are runs of gap 255) and leaves the rest as it is. For SmolLM2-135M after a step at lr 1e-6 (5.6M
// of 135M values change), per sync on one core: level -30 takes 7 ms less to compress and 4 ms
// less to decompress than level -10 for 12% more bytes (12.0 MB against 10.7; stored as is: 16.7
// MB for 5 and 1 ms less again), and level 1 makes 7.1 MB in 16 and 9 ms more than level -10.
// Dense chunks (fp32) are planes of mostly random low bytes: level 1.
inline constexpr int kZstdLevelSparse = -30;
inline constexpr int kZstdLevelDense = 1;
// A compressed full payload (WeightEncoder::set_compress_full: LoRA adapters, a few MB) is the
// delta against zeros at level 3, which entropy-codes the byte planes (negative levels leave
// literals as they are): a value's sign and exponent byte shrinks to about 3 bits.
inline constexpr int kZstdLevelFull = 3;

// Values per hash update: a block of wire values hashed while it is still in L1/L2.
inline constexpr size_t kHashBlock = 4096;

// Bytes per value on the wire: the bf16 half of the bits, or all of them.
inline size_t width_of(WeightDtype d) { return d == WeightDtype::bf16 ? 2 : 4; }

// The bits of x rounded to bf16 (ties to even; NaN kept, quiet), low half zero. Branch-free, so the
// loops that use it vectorize.
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
// The same wire bits into held alone (a payload that is a view of held).
template <int W>
void encode_wire(const float* __restrict m, WireT<W>* __restrict held, size_t n) {
  const auto N = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < N; ++i)
    held[i] = static_cast<WireT<W>>(to_wire<W>(to_dtype_bits<W>(std::bit_cast<std::uint32_t>(m[i]))));
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
// low ones. (delta_coding.h writes and reads these layouts.)
inline constexpr std::uint8_t kChunkZstd = 1;    // a zstd frame (else stored as is)
inline constexpr std::uint8_t kChunkSparse = 2;  // the sparse layout (else dense)

inline size_t chunk_count(size_t elements, size_t chunk) { return chunk == 0 ? 0 : (elements + chunk - 1) / chunk; }
// The most bytes a sparse chunk of len values takes before zstd.
inline size_t sparse_bound(size_t len, size_t W) { return 4 + len * (1 + W) + len / 255 + 1; }

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

// The units over given chunk starts: each tensor's chunks, when every chunk lies inside one tensor
// and the tensors tile the arena; the largest first (the dynamic schedule then balances them).
std::vector<ChunkPlan::Unit> units_of(const std::vector<policy::TensorSpec>& tensors, const std::vector<size_t>& start,
                                      size_t n);
// The encoder's plan: per tensor chunks of at most C values when the table tiles the arena, else
// chunks of C over the arena.
ChunkPlan plan_chunks(const std::vector<policy::TensorSpec>& tensors, size_t n, size_t C);

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
ThreadScratch& thread_scratch();

}  // namespace troupe::actors::codec
