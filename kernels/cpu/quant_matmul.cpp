// The CPU quant ops (quant_matrix.h): y = x W^T and dx += dy W with W in ggml blocks, dequantized
// on the fly. They take gemm_blocked's paths (ops.cpp) on the dequantized values, so they give
// matmul_forward/backward's bits wherever the blocks of work are the same: one or two tokens run a
// fused dequantize-and-FMA chain (small_gemm's per-element chain, AVX2/FMA), other few-token calls
// dequantize 64-row (64-column) tiles into a thread-local scratch for the BLAS sgemm. A group of
// projections of one input runs as its calls one by one would, bit for bit, a decode step's group
// (adapters included) as two jobs of the decode pool (decode_pool.h), which every one- or two-token
// chain call runs on instead of OpenMP.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#include "blas_gemm.h"
#include "decode_pool.h"
#include "lora_rows.h"
#include "quant_chain.h"
#include "quant_blocks.h"
#include "small_gemm.h"
#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/lora.h"
#include "troupe/kernels/ops.h"
#include "troupe/kernels/quant_matrix.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define TROUPE_QUANT_X86 1
#endif

namespace troupe::kernels {
namespace {

constexpr int kTile = kGemmColBlock;  // W rows (forward) or columns (backward) per tile of a few-token call
constexpr int kBigTile = 256;         // the same for calls of more than kGemmRowBlock tokens

// A scratch of at least n floats owned by the calling thread (grown, never shrunk).
float* scratch(size_t n) {
  thread_local std::vector<float> s;
  if (s.size() < n) s.resize(n);
  return s.data();
}

constexpr int kMaxProjections = 8;  // quant_projections_forward's group size (a layer has at most 3)

// gemm_blocked's test for cutting C (M, N) into column blocks (ops.cpp, gemm_column_blocks).
bool column_blocks(int M, int N, int K) {
  return M <= kGemmRowBlock && N > kGemmColBlock && double(N) * K >= kGemmWideMin;
}

#if TROUPE_QUANT_X86
#define TROUPE_AVX2 __attribute__((target("avx2,fma,f16c")))

// Whether this CPU runs the decode chain: small_gemm's kernel (AVX2, FMA) and F16C for the scales.
bool chain_available() {
  // F16C is CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c").
  static const bool ok = small_gemm::available() && [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
  }();
  return ok;
}

// The fp16 at p as a float (vcvtph2ps: exact, as quant_blocks::half_to_float).
TROUPE_AVX2 inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 bytes at p widened to 8 int32 lanes (vpmovzxbd / vpmovsxbd from memory: one shuffle uop).
TROUPE_AVX2 inline __m256i widen8(const uint8_t* p, bool is_signed) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
}

// The 32 values of chunk s of a row, equal bit for bit to quant_blocks::dequant32's. A scale times
// a nibble (or an int8) is exact in fp32 (an fp16 d has 11 significant bits, d * sc of q4_k 17, and
// q 4 or 8), so fma(d, q, m) rounds once exactly where ggml's d * q + m rounds its add.
template <QuantFormat F>
TROUPE_AVX2 inline void decode32(const uint8_t* row, int s, __m256 v[4]) {
  if constexpr (F == QuantFormat::q8_0) {
    const uint8_t* b = row + static_cast<size_t>(s) * 34;
    const __m256 d = _mm256_set1_ps(half_at(b));
    for (int u = 0; u < 4; ++u) v[u] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(widen8(b + 2 + 8 * u, true)));
  } else if constexpr (F == QuantFormat::q4_0 || F == QuantFormat::q4_1 || F == QuantFormat::q4_k) {
    const uint8_t* q;  // 16 nibble bytes: values 0-15 in the low nibbles, 16-31 in the high ones
    __m256 d, m;       // value = d * q + m
    bool high_only = false, low_only = false;
    if constexpr (F == QuantFormat::q4_k) {
      const uint8_t* b = row + static_cast<size_t>(s / 8) * 144;
      const int j = s % 8;
      uint8_t sc, mn;
      quant_blocks::scale_min_k4(j, b + 4, sc, mn);
      q = b + 16 + 32 * (j / 2), d = _mm256_set1_ps(half_at(b) * sc), m = _mm256_set1_ps(-(half_at(b + 2) * mn));
      high_only = (j & 1) != 0, low_only = !high_only;  // a sub-block is one nibble of 32 bytes
    } else {
      const uint8_t* b = row + static_cast<size_t>(s) * quant_block_bytes(F);
      const float df = half_at(b);
      q = b + (F == QuantFormat::q4_0 ? 2 : 4), d = _mm256_set1_ps(df);
      m = _mm256_set1_ps(F == QuantFormat::q4_0 ? -8.0f * df : half_at(b + 2));
    }
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    if (high_only || low_only) {
      for (int u = 0; u < 4; ++u) {
        const __m256i w = widen8(q + 8 * u, false);
        v[u] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(high_only ? _mm256_srli_epi32(w, 4) : _mm256_and_si256(w, low4)), m);
      }
    } else {
      for (int u = 0; u < 2; ++u) {
        const __m256i w = widen8(q + 8 * u, false);
        v[u] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(w, low4)), m);
        v[u + 2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4)), m);
      }
    }
  } else {  // bf16
    const uint8_t* b = row + static_cast<size_t>(s) * 64;
    for (int u = 0; u < 4; ++u) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * u));
      v[u] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

// small_gemm.cpp's lane sum: (v0 + v4) + (v2 + v6) + ((v1 + v5) + (v3 + v7)).
TROUPE_AVX2 inline float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The rows of the next tile, fetched into the cache chunk by chunk while a tile computes: a tile
// reads several short rows side by side, which the hardware prefetcher follows poorly, so without
// it a decode step mostly waits on memory (SmolLM2's projections and q8_0 head on one thread: 17.5
// -> 12 ms of CPU per token). Rows past the matrix are left out.
struct Ahead {
  const char* row;
  size_t rb, chunk_bytes;  // bytes per row, per 32 values
  int rows;
  Ahead(const QuantWeights& W, int first, int n)
      : row(static_cast<const char*>(W.data) + static_cast<size_t>(std::min(first, W.rows)) * W.row_bytes()),
        rb(W.row_bytes()), chunk_bytes(W.row_bytes() / static_cast<size_t>(W.cols / 32)),
        rows(std::max(0, std::min(n, W.rows - first))) {}
  void fetch(int s) const {  // chunk s (values 32 s .. 32 s + 31) of every row
    for (int r = 0; r < rows; ++r) _mm_prefetch(row + r * rb + static_cast<size_t>(s) * chunk_bytes, _MM_HINT_T0);
  }
};

// y[j][o + i] for R rows of W from row o and MR tokens: small_gemm's chain (eight lanes of FMAs
// over k in steps of 8, then lane_sum) on values decoded 32 at a time.
template <QuantFormat F, int R, int MR>
TROUPE_AVX2 void chain_tile(const QuantWeights& W, int o, const float* x, float* y) {
  const auto* w = static_cast<const uint8_t*>(W.data);
  const size_t rb = W.row_bytes();
  const int K = W.cols, N = W.rows;
  const Ahead next(W, o + R, R);
  __m256 acc[R][MR];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int s = 0; s < K / 32; ++s) {
    next.fetch(s);
    const float* xs = x + 32 * s;  // x is read from L1 by each FMA: registers go to the chains
    for (int i = 0; i < R; ++i) {
      __m256 v[4];
      decode32<F>(w + static_cast<size_t>(o + i) * rb, s, v);
      for (int j = 0; j < MR; ++j)
        for (int u = 0; u < 4; ++u)
          acc[i][j] = _mm256_fmadd_ps(v[u], _mm256_loadu_ps(xs + static_cast<size_t>(j) * K + 8 * u), acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MR; ++j) y[static_cast<size_t>(j) * N + o + i] = lane_sum(acc[i][j]);
}

template <QuantFormat F, int MR>
TROUPE_AVX2 void chain_rows_f(const QuantWeights& W, int o0, int o1, const float* x, float* y) {
  constexpr int R = MR == 1 ? 8 : 4;  // independent chains in flight, within the 16 ymm registers
  int o = o0;
  for (; o + R <= o1; o += R) chain_tile<F, R, MR>(W, o, x, y);
  for (; o < o1; ++o) chain_tile<F, 1, MR>(W, o, x, y);
}

// ---- AVX-512F: two rows of W per 16-lane register -------------------------------------------------
// The same chains, two at a time: lanes 0-7 of a zmm are row o's eight lanes, lanes 8-15 row o+1's,
// each lane the same FMA on the same operands in the same order as chain_tile's, so the bits are
// chain_tile's. What changes is the work per value: one instruction decodes or multiplies 16 values
// of two rows, x is broadcast to both halves once per 32 values for every pair, both blocks' fp16
// scales are converted by one instruction, q4_0 / q4_1 nibbles are converted and put through the
// decode's fma(d, q, m) for both rows at once, and a q4_k sub-block's 16 possible values fma(d, q, m)
// are computed once into a table that vpermt2ps reads (the table's entries are the decode's
// fma(d, q, m), so its bits too).
#define TROUPE_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused source of their masked
// builtins, which -Wuninitialized reports wherever they are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

std::atomic<bool> two_row_allowed{true};  // quant_chain::allow_two_row

// Whether the two-row chains run: allowed, and AVX-512F besides the AVX2 chain's needs.
bool wide_available() {
  static const bool ok = chain_available() && __builtin_cpu_supports("avx512f");
  return ok && two_row_allowed.load(std::memory_order_relaxed);
}

// The 8 floats at p in lanes 0-7 and again in lanes 8-15 (vbroadcastf64x4: a load, no shuffle).
TROUPE_AVX512 inline __m512 both_halves(const float* p) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(reinterpret_cast<const double*>(p))));
}

// Bytes [8u, 8u + 8) of the 32-byte runs at p (row o) and q (row o + 1), side by side, for u = 0..3.
TROUPE_AVX512 inline void byte_pairs(const uint8_t* p, const uint8_t* q, __m128i pr[4]) {
  const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
  pr[0] = _mm_unpacklo_epi64(a0, c0), pr[1] = _mm_unpackhi_epi64(a0, c0);
  pr[2] = _mm_unpacklo_epi64(a1, c1), pr[3] = _mm_unpackhi_epi64(a1, c1);
}

// A 4-bit block's 16 values fma(d, n, m), n = 0..15 (decode32's arithmetic).
TROUPE_AVX512 inline __m512 nibble_table(float d, float m) {
  const __m512 n = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_fmadd_ps(_mm512_set1_ps(d), n, _mm512_set1_ps(m));
}

// Lanes 0-7 t0[nib], lanes 8-15 t1[nib] (vpermt2ps over the two tables).
TROUPE_AVX512 inline __m512 table_lookup(__m512 t0, __m512 t1, __m512i nib) {
  const __m512i second = _mm512_set_epi32(16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutex2var_ps(t0, _mm512_or_si512(nib, second), t1);
}

// The first two fp16 fields of blocks b0 and b1 as floats in lanes 0-3 (b0's, then b1's; the second
// field of a q8_0 or q4_0 block is its first values' bytes, lanes nobody reads): one conversion for
// both blocks, where half_at per scale costs the shuffle port three instructions each.
TROUPE_AVX512 inline __m512 block_heads(const uint8_t* b0, const uint8_t* b1) {
  int32_t h0, h1;
  std::memcpy(&h0, b0, 4);
  std::memcpy(&h1, b1, 4);
  return _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(h0), h1, 1)));
}

// Lane A of h in lanes 0-7, lane B in lanes 8-15.
template <int A, int B>
TROUPE_AVX512 inline __m512 pair_lanes(__m512 h) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(B, B, B, B, B, B, B, B, A, A, A, A, A, A, A, A), h);
}

// Chunk s of rows o (lanes 0-7) and o + 1 (lanes 8-15): v[u] holds values 8u .. 8u + 7 of each,
// decode32's bits.
template <QuantFormat F>
TROUPE_AVX512 inline void decode32_pair(const uint8_t* r0, const uint8_t* r1, int s, __m512 v[4]) {
  if constexpr (F == QuantFormat::q8_0) {
    const uint8_t* b0 = r0 + static_cast<size_t>(s) * 34;
    const uint8_t* b1 = r1 + static_cast<size_t>(s) * 34;
    const __m512 d = pair_lanes<0, 2>(block_heads(b0, b1));
    __m128i pr[4];
    byte_pairs(b0 + 2, b1 + 2, pr);
    for (int u = 0; u < 4; ++u) v[u] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(pr[u])));
  } else if constexpr (F == QuantFormat::q4_0 || F == QuantFormat::q4_1) {
    // decode32's fma(d, q, m) on the converted nibbles, both rows at once (the same values a
    // nibble table holds, without building two tables per block).
    const uint8_t* b0 = r0 + static_cast<size_t>(s) * quant_block_bytes(F);
    const uint8_t* b1 = r1 + static_cast<size_t>(s) * quant_block_bytes(F);
    const __m512 heads = block_heads(b0, b1);
    const __m512 d = pair_lanes<0, 2>(heads);
    const __m512 m = F == QuantFormat::q4_0 ? _mm512_mul_ps(_mm512_set1_ps(-8.0f), d) : pair_lanes<1, 3>(heads);
    const int at = F == QuantFormat::q4_0 ? 2 : 4;
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + at));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + at));
    const __m512i lo = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(a, c)), hi = _mm512_cvtepu8_epi32(_mm_unpackhi_epi64(a, c));
    const __m512i low4 = _mm512_set1_epi32(0x0F);
    v[0] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(lo, low4)), m);
    v[1] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(hi, low4)), m);
    v[2] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_srli_epi32(lo, 4)), m);
    v[3] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_srli_epi32(hi, 4)), m);
  } else {  // q4_k: each sub-block's nibbles looked up in its table (32 bytes, one nibble each)
    const int j = s % 8;
    const uint8_t* b0 = r0 + static_cast<size_t>(s / 8) * 144;
    const uint8_t* b1 = r1 + static_cast<size_t>(s / 8) * 144;
    uint8_t sc0, mn0, sc1, mn1;
    quant_blocks::scale_min_k4(j, b0 + 4, sc0, mn0);
    quant_blocks::scale_min_k4(j, b1 + 4, sc1, mn1);
    const __m512 t0 = nibble_table(half_at(b0) * sc0, -(half_at(b0 + 2) * mn0));
    const __m512 t1 = nibble_table(half_at(b1) * sc1, -(half_at(b1 + 2) * mn1));
    const bool high = (j & 1) != 0;
    const __m512i low4 = _mm512_set1_epi32(0x0F);
    __m128i pr[4];
    byte_pairs(b0 + 16 + 32 * (j / 2), b1 + 16 + 32 * (j / 2), pr);
    for (int u = 0; u < 4; ++u) {
      const __m512i w = _mm512_cvtepu8_epi32(pr[u]);
      v[u] = table_lookup(t0, t1, high ? _mm512_srli_epi32(w, 4) : _mm512_and_si512(w, low4));
    }
  }
}

// y[j][o .. o + 2P) for MR tokens: P pairs of rows, chain_tile's chains.
template <QuantFormat F, int P, int MR>
TROUPE_AVX512 void wide_tile(const QuantWeights& W, int o, const float* x, float* y) {
  const auto* w = static_cast<const uint8_t*>(W.data);
  const size_t rb = W.row_bytes();
  const int K = W.cols, N = W.rows;
  const Ahead next(W, o + 2 * P, 2 * P);
  __m512 acc[P][MR];
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int s = 0; s < K / 32; ++s) {
    next.fetch(s);
    __m512 xs[MR][4];  // x's 8 values of step u in both halves
    for (int j = 0; j < MR; ++j)
      for (int u = 0; u < 4; ++u) xs[j][u] = both_halves(x + static_cast<size_t>(j) * K + 32 * s + 8 * u);
    for (int i = 0; i < P; ++i) {
      const uint8_t* r0 = w + static_cast<size_t>(o + 2 * i) * rb;
      __m512 v[4];
      decode32_pair<F>(r0, r0 + rb, s, v);
      for (int j = 0; j < MR; ++j)
        for (int u = 0; u < 4; ++u) acc[i][j] = _mm512_fmadd_ps(v[u], xs[j][u], acc[i][j]);
    }
  }
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < MR; ++j) {
      const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i][j]), 1));
      y[static_cast<size_t>(j) * N + o + 2 * i] = lane_sum(_mm512_castps512_ps256(acc[i][j]));
      y[static_cast<size_t>(j) * N + o + 2 * i + 1] = lane_sum(hi);
    }
}

template <QuantFormat F, int MR>
TROUPE_AVX512 void wide_rows_f(const QuantWeights& W, int o0, int o1, const float* x, float* y) {
  constexpr int P = 4;  // 8 rows: 4 (MR = 1) or 8 (MR = 2) accumulators, x and the tables within 32 zmm
  int o = o0;
  for (; o + 2 * P <= o1; o += 2 * P) wide_tile<F, P, MR>(W, o, x, y);
  for (; o + 2 <= o1; o += 2) wide_tile<F, 1, MR>(W, o, x, y);
  for (; o < o1; ++o) chain_tile<F, 1, MR>(W, o, x, y);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#undef TROUPE_AVX512

// Rows [o0, o1) of y (T, N) for T tokens, two at a time, every element one fixed chain (two rows
// per register with AVX-512F for the 32-value block formats, the same bits).
template <QuantFormat F>
void chain_rows(const QuantWeights& W, int o0, int o1, const float* x, float* y, int T) {
  constexpr bool has_wide = F != QuantFormat::bf16;
  const bool wide = has_wide && wide_available();
  auto rows = [&](auto mr, const float* xt, float* yt) {
    constexpr int MR = decltype(mr)::value;
    if constexpr (has_wide)
      if (wide) return wide_rows_f<F, MR>(W, o0, o1, xt, yt);
    chain_rows_f<F, MR>(W, o0, o1, xt, yt);
  };
  int t = 0;
  for (; t + 2 <= T; t += 2)
    rows(std::integral_constant<int, 2>{}, x + static_cast<size_t>(t) * W.cols, y + static_cast<size_t>(t) * W.rows);
  if (t < T) rows(std::integral_constant<int, 1>{}, x + static_cast<size_t>(t) * W.cols, y + static_cast<size_t>(t) * W.rows);
}

void chain(const QuantWeights& W, int o0, int o1, const float* x, float* y, int T) {
  switch (W.format) {
    case QuantFormat::q8_0: return chain_rows<QuantFormat::q8_0>(W, o0, o1, x, y, T);
    case QuantFormat::q4_0: return chain_rows<QuantFormat::q4_0>(W, o0, o1, x, y, T);
    case QuantFormat::q4_1: return chain_rows<QuantFormat::q4_1>(W, o0, o1, x, y, T);
    case QuantFormat::q4_k: return chain_rows<QuantFormat::q4_k>(W, o0, o1, x, y, T);
    case QuantFormat::bf16: return chain_rows<QuantFormat::bf16>(W, o0, o1, x, y, T);
  }
}
#undef TROUPE_AVX2
#else
bool chain_available() { return false; }
bool wide_available() { return false; }
void chain(const QuantWeights&, int, int, const float*, float*, int) {}
#endif

// Without the chain kernel, batch-invariant mode's one sequential sum per element (ops.cpp).
void invariant_rows_scalar(const QuantWeights& W, int o0, int o1, const float* x, float* y, int T) {
  const int K = W.cols;
  float* tile = scratch(static_cast<size_t>(o1 - o0) * K);
  dequantize_rows(W, o0, o1, tile);
  for (int t = 0; t < T; ++t)
    for (int o = o0; o < o1; ++o) {
      const float* a = x + static_cast<size_t>(t) * K;
      const float* b = tile + static_cast<size_t>(o - o0) * K;
      float s = 0;
      for (int k = 0; k < K; ++k) s += a[k] * b[k];
      y[static_cast<size_t>(t) * W.rows + o] = 1.0f * s;
    }
}

// Rows [o0, o1) of W dequantized, then y[:, o0:o1] = x . tile^T in blocks of kGemmRowBlock tokens.
void tile_forward(const QuantWeights& W, int o0, int o1, const float* x, float* y, int T) {
  const int K = W.cols, N = W.rows, cols = o1 - o0;
  float* tile = scratch(static_cast<size_t>(cols) * K);
  dequantize_rows(W, o0, o1, tile);
  for (int t0 = 0; t0 < T; t0 += kGemmRowBlock)
    gemm(CblasNoTrans, CblasTrans, std::min(kGemmRowBlock, T - t0), cols, K, 1.0f, x + static_cast<size_t>(t0) * K, K,
         tile, K, 0.0f, y + static_cast<size_t>(t0) * N + o0, N);
}

// Columns [c0, c1) of W dequantized (W.rows, c1 - c0), then dx[:, c0:c1] += dy . tile.
void tile_backward(const QuantWeights& W, int c0, int c1, const float* dy, float* dx, int T) {
  const int cols = c1 - c0, O = W.rows, C = W.cols;
  float* tile = scratch(static_cast<size_t>(O) * cols);
  for (int o = 0; o < O; ++o) dequantize_row_range(W, o, c0, c1, tile + static_cast<size_t>(o) * cols);
  for (int t0 = 0; t0 < T; t0 += kGemmRowBlock)
    gemm(CblasNoTrans, CblasNoTrans, std::min(kGemmRowBlock, T - t0), cols, O, 1.0f, dy + static_cast<size_t>(t0) * O, O,
         tile, cols, 1.0f, dx + static_cast<size_t>(t0) * C + c0, C);
}

// Whether a few-token call worth splitting over the threads: the fused chain decodes every weight
// it multiplies (several instructions per value), so it pays off from ~1/8 of gemm_blocked's
// float-GEMM threshold (a decode step's 576 x 576 matvec already gains from 2 threads). Each
// output element is still one fixed chain, so the bits never depend on the split.
bool chain_worth_splitting(double macs) {
  return macs > 1.25e5 && !omp_in_parallel() && omp_get_max_threads() > 1;
}

// fn(i) for every i in [0, n): a decode step's job on the calling thread's decode pool
// (decode_pool.h: no OpenMP wake-up per job) with OpenMP's thread count when `split`, else a loop.
template <class Fn>
void decode_job(int n, bool split, const Fn& fn) {
  if (split) return decode_pool().run(n, omp_get_max_threads(), fn);
  for (int i = 0; i < n; ++i) fn(i);
}

// fn(lo, hi) over [0, n) in pieces of `step`, spread over the threads when `split`: the decode pool's
// for a decode step's chains (`decode`), else OpenMP's.
template <class Fn>
void over_tiles(int n, int step, bool split, const Fn& fn, bool decode = false) {
  const int tiles = (n + step - 1) / step;
  auto tile = [&](int b) { fn(b * step, std::min(n, (b + 1) * step)); };
  if (decode) return decode_job(tiles, split && tiles > 1, tile);
#pragma omp parallel for schedule(static) if (split && tiles > 1)
  for (int b = 0; b < tiles; ++b) tile(b);
}

}  // namespace

#if TROUPE_QUANT_X86
void quant_chain::allow_two_row(bool on) { two_row_allowed.store(on, std::memory_order_relaxed); }
#else
void quant_chain::allow_two_row(bool) {}
#endif
bool quant_chain::two_row_active() { return wide_available(); }

void quant_matmul_forward(float* y, const float* x, const QuantWeights& W, int T) {
  if (T <= 0) return;
  const int N = W.rows, K = W.cols;
  const bool kernel = chain_available();
  const bool split = kernel && T <= kGemmKernelMaxRows ? chain_worth_splitting(double(T) * N * K)
                                                       : gemm_worth_splitting(double(T) * N * K);
  const bool decode = kernel && T <= kGemmKernelMaxRows;  // a decode step's chains: on the decode pool
  if (batch_invariant()) {  // every element one fixed chain (ops.cpp, gemm_nt_invariant)
    over_tiles(N, kTile, split, [&](int o0, int o1) {
      kernel ? chain(W, o0, o1, x, y, T) : invariant_rows_scalar(W, o0, o1, x, y, T);
    }, decode);
  } else if (column_blocks(T, N, K)) {  // gemm_column_blocks: one 64-column block of y per tile
    over_tiles(N, kTile, split, [&](int o0, int o1) {
      decode ? chain(W, o0, o1, x, y, T) : tile_forward(W, o0, o1, x, y, T);
    }, decode);
  } else if (T <= kGemmRowBlock || double(N) * K < kGemmWideMin) {  // a small W: gemm_blocked on all of it
    float* w = scratch(static_cast<size_t>(N) * K);
    dequantize_rows(W, 0, N, w);
    gemm_blocked(false, true, T, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
  } else {  // many tokens against a large W: tiles of W rows, each against every block of tokens
    over_tiles(N, kBigTile, split, [&](int o0, int o1) { tile_forward(W, o0, o1, x, y, T); });
  }
}

void quant_projections_forward(const QuantProjection* p, int n, const float* x, int T) {
  // The chain path of quant_matmul_forward for every matrix (its bits do not depend on the tiles)
  // and lora_forward's few-row path (lora_rows.h) for every adapter, else the calls one by one.
  bool chained = T > 0 && T <= kGemmKernelMaxRows && chain_available() && n <= kMaxProjections;
  double macs = 0;
  int tiles = 0, ranks = 0;
  int first_tile[kMaxProjections + 1] = {}, first_rank[kMaxProjections + 1] = {};
  size_t u_at[kMaxProjections] = {}, u_floats = 0;
  for (int i = 0; chained && i < n; ++i) {
    const QuantWeights& W = p[i].W;
    chained = batch_invariant() || column_blocks(T, W.rows, W.cols);
    macs += double(T) * W.rows * W.cols;
    first_tile[i] = tiles, first_rank[i] = ranks, u_at[i] = u_floats;
    tiles += (W.rows + kTile - 1) / kTile;
    if (!p[i].A) continue;
    ranks += p[i].r;
    u_floats += static_cast<size_t>(T) * p[i].r;
    macs += double(T) * p[i].r * (W.rows + W.cols);
  }
  if (!chained) {
    for (int i = 0; i < n; ++i) {
      quant_matmul_forward(p[i].y, x, p[i].W, T);
      if (p[i].A) lora_forward(p[i].y, x, p[i].A, p[i].B, p[i].scratch, T, p[i].W.cols, p[i].W.rows, p[i].r, p[i].scale);
    }
    return;
  }
  first_tile[n] = tiles, first_rank[n] = ranks;
  // Every u = x A^T (T, r) side by side in the calling thread's scratch (the chains use none).
  float* u = scratch(u_floats);
  auto owner = [n](const int* first, int b) {
    return static_cast<int>(std::upper_bound(first, first + n + 1, b) - first) - 1;
  };
  // Two decode-pool jobs: the adapters' u a column each, then every 64-row tile of every matrix
  // with its adapter's up product on the same rows. The bits are those of the calls one by one.
  const bool split = chain_worth_splitting(macs);
  decode_job(ranks, split, [&](int c) {
    const int i = owner(first_rank, c), j = c - first_rank[i];
    lora_rows::down(u + u_at[i], x, p[i].A, T, p[i].W.cols, p[i].r, j, j + 1);
  });
  decode_job(tiles, split, [&](int b) {
    const int i = owner(first_tile, b);
    const QuantWeights& W = p[i].W;
    const int o0 = (b - first_tile[i]) * kTile, o1 = std::min(W.rows, o0 + kTile);
    chain(W, o0, o1, x, p[i].y, T);
    if (p[i].A) lora_rows::up(p[i].y, u + u_at[i], p[i].B, T, W.rows, p[i].r, p[i].scale, o0, o1);
  });
}

void quant_matmul_backward_input(float* dx, const float* dy, const QuantWeights& W, int T) {
  if (T <= 0) return;
  const int O = W.rows, C = W.cols;
  const bool split = gemm_worth_splitting(double(T) * O * C);
  if (column_blocks(T, C, O)) {
    over_tiles(C, kTile, split, [&](int c0, int c1) { tile_backward(W, c0, c1, dy, dx, T); });
  } else if (T <= kGemmRowBlock || double(O) * C < kGemmWideMin) {
    float* w = scratch(static_cast<size_t>(O) * C);
    dequantize_rows(W, 0, O, w);
    gemm_blocked(false, false, T, C, O, 1.0f, dy, O, w, C, 1.0f, dx, C);
  } else {
    over_tiles(C, kBigTile, split, [&](int c0, int c1) { tile_backward(W, c0, c1, dy, dx, T); });
  }
}

}  // namespace troupe::kernels
