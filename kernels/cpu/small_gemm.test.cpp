// kernels.small_gemm: GEMMs of few rows against a wide operand (gemm_blocked's column blocks and
// the row-times-row kernel of cpu/small_gemm.h) give the same bits on 1, 2 and 3 threads, match
// an fp64 reference, and, in the kernel, give a row the same bits whatever else is in the call.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "small_gemm.h"
#include "troupe/kernels/ops.h"

namespace k = troupe::kernels;

namespace {

std::vector<float> normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

struct Shape {
  int M, N, K;
};
// Odd sizes: column blocks with a ragged last one, K % 8 != 0, 1 and 2 rows (the kernel), more
// rows (OpenBLAS per column block), one row block exactly; the last five are over 1e6
// multiply-adds, so their blocks spread over the threads.
const Shape kShapes[] = {{1, 577, 129},  {2, 1000, 131}, {3, 130, 601},  {1, 10001, 7},  {5, 333, 300},
                         {2, 65, 1100},  {1, 3001, 577}, {2, 2050, 301}, {1, 4099, 250}, {17, 200, 333},
                         {64, 129, 515}};

// C = alpha op(A) op(B) + beta C0 through gemm_blocked on `threads` threads.
std::vector<float> run(int threads, bool ta, bool tb, const Shape& s, float alpha, float beta, const std::vector<float>& A,
                       const std::vector<float>& B, const std::vector<float>& C0) {
  const int lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
  std::vector<float> C = C0;
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  k::gemm_blocked(ta, tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), s.N);
  omp_set_num_threads(before);
  return C;
}

}  // namespace

TEST(SmallGemm, ShapesUseTheWidePath) {
  for (const Shape& s : kShapes) {
    EXPECT_LE(s.M, k::kGemmRowBlock);
    EXPECT_GT(s.N, k::kGemmColBlock);
    EXPECT_GE(double(s.N) * s.K, k::kGemmWideMin);
  }
}

TEST(SmallGemm, BitIdenticalOnOneTwoThreeThreadsAndMatchesFp64) {
  for (const Shape& s : kShapes)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const float alpha = t == 0 ? 1.0f : 0.75f, beta = t < 2 ? 0.0f : 0.5f;
      const auto A = normal(size_t(s.M) * s.K, 1 + t), B = normal(size_t(s.N) * s.K, 2 + t),
                 C0 = normal(size_t(s.M) * s.N, 3 + t);
      const auto c1 = run(1, ta, tb, s, alpha, beta, A, B, C0);
      for (int threads : {2, 3})
        EXPECT_EQ(std::memcmp(c1.data(), run(threads, ta, tb, s, alpha, beta, A, B, C0).data(),
                              c1.size() * sizeof(float)),
                  0)
            << "M " << s.M << " N " << s.N << " K " << s.K << " trans " << ta << tb << " threads " << threads;
      const int lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
      double worst = 0;
      for (int m = 0; m < s.M; ++m)
        for (int n = 0; n < s.N; ++n) {
          double ref = 0, mag = 0;
          for (int kk = 0; kk < s.K; ++kk) {
            const double a = ta ? A[size_t(kk) * lda + m] : A[size_t(m) * lda + kk];
            const double b = tb ? B[size_t(n) * ldb + kk] : B[size_t(kk) * ldb + n];
            ref += a * b;
            mag += std::fabs(a * b);
          }
          const double c0 = beta * C0[size_t(m) * s.N + n];
          ref = alpha * ref + c0;
          // The fp32 rounding bound of a K-term sum, (K + 4) u times the sum of magnitudes.
          const double bound = (s.K + 4) * 6e-8 * (alpha * mag + std::fabs(c0)) + 1e-30;
          worst = std::max(worst, std::fabs(c1[size_t(m) * s.N + n] - ref) / bound);
        }
      EXPECT_LT(worst, 1.0) << "M " << s.M << " N " << s.N << " K " << s.K << " trans " << ta << tb;
    }
}

TEST(SmallGemm, MatmulForwardAtBatchOneIsThreadInvariant) {
  const int C = 576, OC = 4096;  // a slice of SmolLM2's LM head at batch 1: over 1e6 multiply-adds
  const auto x = normal(C, 7), w = normal(size_t(OC) * C, 8);
  std::vector<std::vector<float>> outs;
  const int before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> out(OC);
    k::matmul_forward(out.data(), x.data(), w.data(), 1, C, OC);
    outs.push_back(out);
  }
  omp_set_num_threads(before);
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

// The kernel's element chain depends only on its two rows: a row of A alone, or paired with
// another, over any column range, gives the same bits.
TEST(SmallGemm, KernelRowBitsIndependentOfCallShape) {
  if (!k::small_gemm::available()) GTEST_SKIP() << "no AVX2/FMA on this CPU";
  const int N = 203, K = 77;
  const auto A = normal(2 * size_t(K), 11), B = normal(size_t(N) * K, 12);
  std::vector<float> both(2 * size_t(N)), one(N), parts(N);
  k::small_gemm::gemm_nt_rows(2, 0, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, both.data(), N);
  k::small_gemm::gemm_nt_rows(1, 0, N, K, 1.0f, A.data() + K, K, B.data(), K, 0.0f, one.data(), N);
  for (int n0 = 0; n0 < N; n0 += 13)
    k::small_gemm::gemm_nt_rows(1, n0, std::min(N, n0 + 13), K, 1.0f, A.data() + K, K, B.data(), K, 0.0f,
                                parts.data(), N);
  EXPECT_EQ(std::memcmp(both.data() + N, one.data(), N * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(one.data(), parts.data(), N * sizeof(float)), 0);
}
