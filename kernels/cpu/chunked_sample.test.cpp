// The chunked LM-head sampler against sample_token on whole logits rows: the same token, the same
// log-prob bits and the same RNG state after each draw, for greedy, plain temperature, top-k,
// top-k + top-p and top-p alone, with rows of different settings in one call; with every chunk's
// logits kept in the scratch (the default budget) and recomputed on every pass (budget 0), which
// agree bit for bit, also on a scratch sized for more rows than the call samples.
#include "troupe/kernels/chunked_sample.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "troupe/kernels/ops.h"

namespace troupe::kernels {
namespace {

// Row n's logits as the sampler sees them: chunk by chunk from the N-row GEMM, or (rows that need
// their whole distribution) one (1, V) GEMM of that row.
std::vector<float> reference_row(const std::vector<float>& h, const std::vector<float>& W, int N, int C, int V,
                                 int chunk, int n, bool whole_row) {
  std::vector<float> row(V);
  if (whole_row || chunk <= 0 || V <= chunk) {
    if (whole_row) {
      matmul_forward(row.data(), h.data() + static_cast<size_t>(n) * C, W.data(), 1, C, V);
    } else {
      std::vector<float> all(static_cast<size_t>(N) * V);
      matmul_forward(all.data(), h.data(), W.data(), N, C, V);
      std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(n) * V, V, row.begin());
    }
    return row;
  }
  for (int c0 = 0; c0 < V; c0 += chunk) {
    const int cols = std::min(chunk, V - c0);
    std::vector<float> z(static_cast<size_t>(N) * cols);
    matmul_forward(z.data(), h.data(), W.data() + static_cast<size_t>(c0) * C, N, C, cols);
    std::copy_n(z.begin() + static_cast<std::ptrdiff_t>(n) * cols, cols, row.begin() + c0);
  }
  return row;
}

// Greedy, plain, top-k, top-k with top-p, top-p, and a wide top-k: row n samples with kKinds[n % 6].
constexpr SampleParams kKinds[] = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.7f, 5, 1.0f},
                                   {1.0f, 8, 0.6f}, {1.0f, 0, 0.9f}, {1.3f, 40, 1.0f}};

// Hidden states h (N, C) ~ N(0, 1) and an LM head W (V, C) ~ N(0, 0.3^2), from `seed`.
void random_head(int N, int C, int V, uint64_t seed, std::vector<float>& h, std::vector<float>& W) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> nd(0, 1);
  h.resize(static_cast<size_t>(N) * C);
  W.resize(static_cast<size_t>(V) * C);
  for (auto& x : h) x = static_cast<float>(nd(g));
  for (auto& x : W) x = static_cast<float>(0.3 * nd(g));
}

void check(int N, int C, int V, int chunk, uint64_t seed, size_t cache_bytes = kChunkedSampleCacheBytes) {
  std::vector<float> h, W;
  random_head(N, C, V, seed, h, W);
  std::vector<SampleParams> sp(N);
  std::vector<uint64_t> rng(N), ref_rng(N);
  for (int n = 0; n < N; ++n) sp[n] = kKinds[n % 6], rng[n] = ref_rng[n] = 1000 + static_cast<uint64_t>(n);
  const int max_k = 40;
  std::vector<char> scratch(chunked_sample_scratch_bytes(N, V, chunk, max_k, cache_bytes) + 16);
  std::vector<char> ref_scratch(sample_scratch_bytes(V) + 16);
  std::vector<int32_t> tok(N);
  std::vector<float> lp(N);
  for (int draw = 0; draw < 6; ++draw) {
    chunked_sample(tok.data(), lp.data(), h.data(), W.data(), N, C, V, chunk, sp.data(), rng.data(), max_k,
                   scratch.data(), cache_bytes);
    for (int n = 0; n < N; ++n) {
      const bool k_on = sp[n].top_k > 0 && sp[n].top_k < V;
      const bool whole_row = chunk > 0 && V > chunk && sp[n].temperature > 0 && !k_on && sp[n].top_p < 1.0f;
      const auto row = reference_row(h, W, N, C, V, chunk, n, whole_row);
      float ref_lp = 0;
      const int32_t ref = sample_token(&ref_lp, row.data(), V, sp[n], &ref_rng[n], ref_scratch.data());
      EXPECT_EQ(tok[n], ref) << "row " << n << " draw " << draw;
      EXPECT_EQ(lp[n], ref_lp) << "row " << n << " draw " << draw;
      EXPECT_EQ(rng[n], ref_rng[n]) << "row " << n << " draw " << draw;
    }
  }
}

TEST(ChunkedSample, EqualsSampleTokenOnWholeRows) { check(7, 48, 1000, 128, 1); }
TEST(ChunkedSample, ManyRowsUnevenLastChunk) { check(70, 32, 777, 100, 2); }
TEST(ChunkedSample, RecomputingPathEqualsSampleToken) {
  check(7, 48, 1000, 128, 5, 0);
  check(70, 32, 777, 100, 6, 0);
}

// The same draws with the logits cached and recomputed: tokens, log-prob bits and RNG states. The
// cached call reuses a scratch sized for more rows than the budget caches (as the model sizes it
// for its batch and samples its active rows), the recomputing one a scratch sized for budget 0.
TEST(ChunkedSample, CachedAndRecomputingPathsAgree) {
  const int N_max = 40, C = 32, V = 900, chunk = 128, max_k = 40;
  const size_t budget = sizeof(float) * 24 * V;  // caches calls of up to 24 rows
  std::vector<float> h, W;
  random_head(N_max, C, V, 7, h, W);
  std::vector<SampleParams> sp(N_max);
  for (int n = 0; n < N_max; ++n) sp[n] = kKinds[n % 6];
  std::vector<char> cached(chunked_sample_scratch_bytes(N_max, V, chunk, max_k, budget));
  std::vector<char> recomputed(chunked_sample_scratch_bytes(N_max, V, chunk, max_k, 0));
  EXPECT_GE(cached.size(), sizeof(float) * 24 * V);
  EXPECT_LT(recomputed.size(), sizeof(float) * 24 * V);
  for (const int N : {N_max, 24, 9, 1}) {  // 40 rows recompute under the budget, the rest cache
    std::vector<uint64_t> rng_a(N), rng_b(N);
    for (int n = 0; n < N; ++n) rng_a[n] = rng_b[n] = 77 + static_cast<uint64_t>(n);
    std::vector<int32_t> tok_a(N), tok_b(N);
    std::vector<float> lp_a(N), lp_b(N);
    for (int draw = 0; draw < 4; ++draw) {
      chunked_sample(tok_a.data(), lp_a.data(), h.data(), W.data(), N, C, V, chunk, sp.data(), rng_a.data(), max_k,
                     cached.data(), budget);
      chunked_sample(tok_b.data(), lp_b.data(), h.data(), W.data(), N, C, V, chunk, sp.data(), rng_b.data(), max_k,
                     recomputed.data(), 0);
      for (int n = 0; n < N; ++n) {
        EXPECT_EQ(tok_a[n], tok_b[n]) << N << " rows, row " << n << " draw " << draw;
        EXPECT_EQ(lp_a[n], lp_b[n]) << N << " rows, row " << n << " draw " << draw;
        EXPECT_EQ(rng_a[n], rng_b[n]) << N << " rows, row " << n << " draw " << draw;
      }
    }
  }
}

TEST(ChunkedSample, OneChunkIsTheWholeVocabularyPath) {
  check(5, 32, 300, 4096, 3);
  check(5, 32, 300, 0, 4);
}

}  // namespace
}  // namespace troupe::kernels
