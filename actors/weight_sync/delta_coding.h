// Delta coding of one chunk (internal to actors/weight_sync/; the layouts are in wire_format.h):
// the encoder's side turns new values and the held ones into the sparse layout (bf16: gaps and the
// changed values' XOR planes) or the dense one (fp32: every XOR's byte planes); the decoder's side
// XORs such a chunk into the values it holds. XOR is its own inverse, so applying a chunk twice
// restores the values, which is how a failed delta is undone.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "wire_format.h"
#include "wire_hash.h"

namespace troupe::actors::codec {

// ---- encoding ----

// The bf16 scan at the heart of a sparse delta. Values m[0, len) are rounded to their bf16 wire
// form (into `packed`, which the checksum hashes) and compared with held; each change is written
// into held and recorded: its gap (the unchanged values since the position c.next, as bytes: 255
// means "255 more, go on") in gaps[c.g...], its XOR in xors[c.j...]. pos0 is m[0]'s position in
// its chunk. Compiled for AVX2 too, picked at run time.
struct SparseCursor {
  size_t g = 0, j = 0, next = 0;  // gap bytes and XORs written, the position after the last change
};
void sparse_scan(const float* m, std::uint16_t* held, size_t len, size_t pos0, std::uint8_t* gaps,
                 std::uint16_t* xors, SparseCursor& c, std::uint16_t* packed);

// The sparse layout around gaps already at raw + 4 (G bytes): the count before them, the j XORs'
// byte planes after them. Returns the layout's bytes.
size_t finish_sparse(std::uint8_t* __restrict raw, size_t G, const std::uint16_t* __restrict xors, size_t j);

// Sparse (bf16): held becomes the new values (only the changed ones are written); `raw` gets the
// sparse layout, `xors` the changed values' XORs on the way. Returns how many changed; *raw_size
// its bytes. With st, the new values (wire form) are hashed into it, a block at a time in cache.
size_t encode_sparse(const float* m, std::uint16_t* held, size_t len, std::uint8_t* raw, std::uint16_t* xors,
                     size_t* raw_size, XXH3_state_t* st);

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

// ---- decoding ----

template <int W>
inline std::uint32_t join_planes(const std::uint8_t* planes, size_t n, size_t i) {
  std::uint32_t d = 0;
  for (int p = 0; p < W; ++p) d |= static_cast<std::uint32_t>(planes[static_cast<size_t>(p) * n + i]) << (8 * p);
  return d;
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
  // The next change's position into `at` (have = true); false (bad) when the gaps run out or lead outside.
  bool find_next() {
    size_t gap = 0;
    while (g < G && gaps[g] == 255) gap += 255, ++g;
    if (g < G) {
      gap += gaps[g++];
      at = next + gap;
      have = at < len;
    }
    if (!have) bad = true;
    return have;
  }
  void apply_until(float* __restrict v, size_t end, size_t most = SIZE_MAX) {
    while (j < count && j < most) {
      if (!have && !find_next()) return;
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
  // A walk that failed part way: its first j changes XORed again, so v is as it was.
  void undo(const std::uint8_t* raw, size_t raw_size, float* v) const {
    SparseWalk back;
    back.open(raw, raw_size, len);
    back.apply_until(v, len, j);
  }
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
  walk.undo(raw, raw_size, v);
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
  walk.undo(raw, raw_size, v);
  return false;
}
// (compiled for AVX2 too, as sparse_scan)
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
const std::uint8_t* chunk_raw(const std::uint8_t* src, size_t bytes, bool zstd, size_t most, size_t* raw_size);

}  // namespace troupe::actors::codec
