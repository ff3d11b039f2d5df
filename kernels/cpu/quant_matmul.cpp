// The CPU quant ops (quant_matrix.h): y = x W^T and dx += dy W with W in ggml blocks, dequantized
// on the fly. They take gemm_blocked's paths (ops.cpp) on the dequantized values, so they give
// matmul_forward/backward's bits wherever the blocks of work are the same: one or two tokens run a
// fused dequantize-and-FMA chain (small_gemm's per-element chain, AVX2/FMA), other few-token calls
// dequantize 64-row (64-column) tiles into a thread-local scratch for the BLAS sgemm. A group of
// projections of one input runs as its calls one by one would, bit for bit.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "blas_gemm.h"
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

// y[j][o + i] for R rows of W from row o and MR tokens: small_gemm's chain (eight lanes of FMAs
// over k in steps of 8, then lane_sum) on values decoded 32 at a time.
template <QuantFormat F, int R, int MR>
TROUPE_AVX2 void chain_tile(const QuantWeights& W, int o, const float* x, float* y) {
  const auto* w = static_cast<const uint8_t*>(W.data);
  const size_t rb = W.row_bytes();
  const int K = W.cols, N = W.rows;
  __m256 acc[R][MR];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int s = 0; s < K / 32; ++s) {
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

// Rows [o0, o1) of y (T, N) for T tokens, two at a time, every element one fixed chain.
template <QuantFormat F>
void chain_rows(const QuantWeights& W, int o0, int o1, const float* x, float* y, int T) {
  int t = 0;
  for (; t + 2 <= T; t += 2)
    chain_rows_f<F, 2>(W, o0, o1, x + static_cast<size_t>(t) * W.cols, y + static_cast<size_t>(t) * W.rows);
  if (t < T) chain_rows_f<F, 1>(W, o0, o1, x + static_cast<size_t>(t) * W.cols, y + static_cast<size_t>(t) * W.rows);
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

// fn(lo, hi) over [0, n) in pieces of `step`, spread over the OpenMP threads when `split`.
template <class Fn>
void over_tiles(int n, int step, bool split, const Fn& fn) {
  const int tiles = (n + step - 1) / step;
#pragma omp parallel for schedule(static) if (split && tiles > 1)
  for (int b = 0; b < tiles; ++b) fn(b * step, std::min(n, (b + 1) * step));
}

}  // namespace

void quant_matmul_forward(float* y, const float* x, const QuantWeights& W, int T) {
  if (T <= 0) return;
  const int N = W.rows, K = W.cols;
  const bool kernel = chain_available();
  const bool split = kernel && T <= kGemmKernelMaxRows ? chain_worth_splitting(double(T) * N * K)
                                                       : gemm_worth_splitting(double(T) * N * K);
  if (batch_invariant()) {  // every element one fixed chain (ops.cpp, gemm_nt_invariant)
    over_tiles(N, kTile, split, [&](int o0, int o1) {
      kernel ? chain(W, o0, o1, x, y, T) : invariant_rows_scalar(W, o0, o1, x, y, T);
    });
  } else if (column_blocks(T, N, K)) {  // gemm_column_blocks: one 64-column block of y per tile
    over_tiles(N, kTile, split, [&](int o0, int o1) {
      kernel && T <= kGemmKernelMaxRows ? chain(W, o0, o1, x, y, T) : tile_forward(W, o0, o1, x, y, T);
    });
  } else if (T <= kGemmRowBlock || double(N) * K < kGemmWideMin) {  // a small W: gemm_blocked on all of it
    float* w = scratch(static_cast<size_t>(N) * K);
    dequantize_rows(W, 0, N, w);
    gemm_blocked(false, true, T, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
  } else {  // many tokens against a large W: tiles of W rows, each against every block of tokens
    over_tiles(N, kBigTile, split, [&](int o0, int o1) { tile_forward(W, o0, o1, x, y, T); });
  }
}

void quant_projections_forward(const QuantProjection* p, int n, const float* x, int T) {
  // The chain path of quant_matmul_forward for every matrix (its bits do not depend on the tiles),
  // else the calls one by one.
  bool chained = T > 0 && T <= kGemmKernelMaxRows && chain_available() && n <= kMaxProjections;
  double macs = 0;
  int tiles = 0;
  int first_tile[kMaxProjections + 1] = {};
  for (int i = 0; chained && i < n; ++i) {
    const QuantWeights& W = p[i].W;
    chained = batch_invariant() || column_blocks(T, W.rows, W.cols);
    macs += double(T) * W.rows * W.cols;
    first_tile[i] = tiles;
    tiles += (W.rows + kTile - 1) / kTile;
  }
  if (!chained) {
    for (int i = 0; i < n; ++i) {
      quant_matmul_forward(p[i].y, x, p[i].W, T);
      if (p[i].A) lora_forward(p[i].y, x, p[i].A, p[i].B, p[i].scratch, T, p[i].W.cols, p[i].W.rows, p[i].r, p[i].scale);
    }
    return;
  }
  first_tile[n] = tiles;
#pragma omp parallel for schedule(static) if (chain_worth_splitting(macs))
  for (int b = 0; b < tiles; ++b) {
    const int i = static_cast<int>(std::upper_bound(first_tile, first_tile + n + 1, b) - first_tile) - 1;
    const QuantWeights& W = p[i].W;
    const int o0 = (b - first_tile[i]) * kTile;
    chain(W, o0, std::min(W.rows, o0 + kTile), x, p[i].y, T);
  }
  // The low-rank paths on the calling thread: OpenBLAS called from two OpenMP threads at once made
  // a decode step several times slower.
  for (int i = 0; i < n; ++i)
    if (p[i].A) lora_forward(p[i].y, x, p[i].A, p[i].B, p[i].scratch, T, p[i].W.cols, p[i].W.rows, p[i].r, p[i].scale);
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
