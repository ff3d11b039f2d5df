// Bf16Weights (bf16_weights.h): frozen weights packed as bf16 pairs for vdpbf16ps, and the GEMM.
// Layout: the weight's output columns in blocks of kCols = 64 (4 vectors of 16), zero-padded; a
// block holds, for each pair p of the input dimension (zero-padded to even), 64 x (W[o][2p],
// W[o][2p+1]). The activations become rows of such pairs. A tile of at most kRows rows x 64 columns
// keeps 4 x kRows fp32 accumulators in registers over every pair in order: each output element's
// chain is fixed by k alone, so the bits never depend on the tiles, the threads or the shape.
#include "troupe/kernels/bf16_weights.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

namespace troupe::kernels {

namespace {

constexpr int kCols = 64;      // output columns per packed block (4 zmm of 16)
constexpr int kRows = 6;       // rows per register tile (4 x 6 = 24 accumulators)
constexpr int kTileRows = 48;  // rows per unit of work (a multiple of kRows)

// fp32 -> bf16, rounded to nearest even (NaN stays a quiet NaN), as vcvtne2ps2bf16 rounds normals.
inline uint16_t to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

thread_local Bf16Weights* current = nullptr;

#define TROUPE_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// out rows [0, R) x the block's columns [0, cols) = A's R rows of Kp pairs . the block (Kp x 4 vectors).
template <int R>
TROUPE_BF16_TARGET void tile(const uint32_t* A, int Kp, const uint16_t* block, float* out, int ldo, int cols) {
  __m512 acc[R][4];  // in registers: the loops over r and j unrolled whatever the optimization level
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int p = 0; p < Kp; ++p) {
    const uint16_t* b = block + static_cast<size_t>(p) * kCols * 2;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32);
    const __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + 64), b3 = (__m512bh)_mm512_loadu_si512(b + 96);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(A[static_cast<size_t>(r) * Kp + p]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, b2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, b3);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const int left = cols - 16 * j;
      if (left <= 0) break;
      const __mmask16 m = left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
      _mm512_mask_storeu_ps(out + static_cast<size_t>(r) * ldo + 16 * j, m, acc[r][j]);
    }
}

using TileFn = void (*)(const uint32_t*, int, const uint16_t*, float*, int, int);
constexpr TileFn kTiles[kRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// Rows of x (n x C) as bf16 pairs (n x Kp), the odd tail padded with 0.
void pack_rows(uint32_t* dst, const float* x, int n, int C, int Kp) {
#pragma omp parallel for schedule(static) if (static_cast<double>(n) * C > 1e5)
  for (int r = 0; r < n; ++r) {
    const float* row = x + static_cast<size_t>(r) * C;
    uint32_t* d = dst + static_cast<size_t>(r) * Kp;
    for (int p = 0; p < Kp; ++p) {
      const uint32_t lo = to_bf16(row[2 * p]);
      const uint32_t hi = 2 * p + 1 < C ? to_bf16(row[2 * p + 1]) : 0u;
      d[p] = lo | (hi << 16);
    }
  }
}

}  // namespace

struct Bf16Weights::Packed {
  int C = 0, OC = 0, Kp = 0, blocks = 0;
  std::vector<uint16_t> data;  // blocks x Kp x kCols x 2
};

Bf16Weights::Bf16Weights() = default;
Bf16Weights::~Bf16Weights() = default;

bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

const Bf16Weights::Packed& Bf16Weights::packed(const float* W, int C, int OC) {
  std::lock_guard lk(mu_);
  auto& slot = packed_[{W, C, OC}];
  if (slot) return *slot;
  auto p = std::make_unique<Packed>();
  p->C = C, p->OC = OC, p->Kp = (C + 1) / 2, p->blocks = (OC + kCols - 1) / kCols;
  p->data.assign(static_cast<size_t>(p->blocks) * p->Kp * kCols * 2, 0);
  for (int o = 0; o < OC; ++o) {
    uint16_t* col = p->data.data() + static_cast<size_t>(o / kCols) * p->Kp * kCols * 2 + (o % kCols) * 2;
    const float* w = W + static_cast<size_t>(o) * C;
    for (int k = 0; k < C; ++k) col[static_cast<size_t>(k / 2) * kCols * 2 + (k & 1)] = to_bf16(w[k]);
  }
  slot = std::move(p);
  return *slot;
}

size_t Bf16Weights::packed_bytes() const {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (const auto& [k, p] : packed_) n += p->data.size() * sizeof(uint16_t);
  return n;
}

void Bf16Weights::matmul(float* out, const float* inp, const float* W, int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  const Packed& w = packed(W, C, OC);
  // the activations' bf16 pairs, in a buffer each thread keeps (a fresh one per call was a fresh
  // mmap, page faults and all, for every GEMM of a forward)
  thread_local std::vector<uint32_t> a;
  a.resize(static_cast<size_t>(N) * w.Kp);
  pack_rows(a.data(), inp, N, C, w.Kp);
  const uint32_t* rows_bf16 = a.data();  // (the OpenMP threads' own `a` is another buffer)
  const int row_tiles = (N + kTileRows - 1) / kTileRows, units = row_tiles * w.blocks;
  const bool split = static_cast<double>(N) * OC * C > 1e6 && !omp_in_parallel() && omp_get_max_threads() > 1;
  // units in column-block order: a thread's consecutive units share a packed block (kept in cache)
#pragma omp parallel for schedule(static) if (split)
  for (int u = 0; u < units; ++u) {
    const int b = u / row_tiles, r0 = (u % row_tiles) * kTileRows;
    const int rows = std::min(kTileRows, N - r0), cols = std::min(kCols, OC - b * kCols);
    const uint16_t* block = w.data.data() + static_cast<size_t>(b) * w.Kp * kCols * 2;
    for (int r = 0; r < rows; r += kRows) {
      const int n = std::min(kRows, rows - r);
      kTiles[n](rows_bf16 + static_cast<size_t>(r0 + r) * w.Kp, w.Kp, block,
                out + static_cast<size_t>(r0 + r) * OC + static_cast<size_t>(b) * kCols, OC, cols);
    }
  }
}

Bf16WeightsScope::Bf16WeightsScope(Bf16Weights* w) : prev_(current) {
  current = w && cpu_has_avx512_bf16() ? w : nullptr;
}
Bf16WeightsScope::~Bf16WeightsScope() { current = prev_; }

Bf16Weights* bf16_weights() { return current; }

}  // namespace troupe::kernels
