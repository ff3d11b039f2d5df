// Delta coding's out-of-line parts (delta_coding.h): the bf16 sparse scan (generic and AVX2,
// picked at run time), the sparse layout's count and planes, a whole sparse chunk, and a chunk's
// zstd frame decompressed into the thread's scratch. Same bytes whichever instruction set runs.
#include "delta_coding.h"

#include <omp.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace troupe::actors::codec {

namespace {

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

}  // namespace

void sparse_scan(const float* m, std::uint16_t* held, size_t len, size_t pos0, std::uint8_t* gaps,
                 std::uint16_t* xors, SparseCursor& c, std::uint16_t* packed) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  if (avx2) return sparse_scan_avx2(m, held, len, pos0, gaps, xors, c, packed);
#endif
  sparse_scan_generic(m, held, len, pos0, gaps, xors, c, packed);
}

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

}  // namespace troupe::actors::codec
