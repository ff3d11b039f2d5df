// kernels.bf16_weights: the bf16 GEMM of frozen weights (bf16_weights.h) equals the product of the
// bf16-rounded inputs (fp64 reference, fp32 accumulation's rounding only), gives the same bits on
// 1 and 2 threads and for a row alone or among others (each element one chain over k), covers odd
// and padded shapes, and matmul_forward takes it only inside a Bf16WeightsScope outside batch-
// invariant mode. Skipped on a CPU without AVX512-BF16.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/bf16_weights.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels {
namespace {

float round_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, sizeof u);
  return f;
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

class Bf16WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  }
};

TEST_F(Bf16WeightsTest, EqualsTheProductOfTheRoundedInputs) {
  for (auto [N, C, OC] : {std::tuple{1, 8, 16}, {7, 33, 70}, {13, 64, 64}, {50, 577, 130}, {255, 576, 192}}) {
    auto x = randn(static_cast<size_t>(N) * C, 1), w = randn(static_cast<size_t>(OC) * C, 2);
    Bf16Weights bw;
    std::vector<float> y(static_cast<size_t>(N) * OC, -1.f);
    bw.matmul(y.data(), x.data(), w.data(), N, C, OC);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        double ref = 0, mag = 0;
        for (int k = 0; k < C; ++k) {
          const double p = double(round_bf16(x[size_t(n) * C + k])) * double(round_bf16(w[size_t(o) * C + k]));
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[size_t(n) * OC + o], ref, 1e-5 * mag + 1e-6) << N << "x" << C << "x" << OC << " at " << n << "," << o;
      }
  }
}

TEST_F(Bf16WeightsTest, SameBitsOnAnyThreadCountAndForARowAlone) {
  const int N = 255, C = 576, OC = 1536;
  auto x = randn(static_cast<size_t>(N) * C, 3), w = randn(static_cast<size_t>(OC) * C, 4);
  Bf16Weights bw;
  std::vector<float> one(static_cast<size_t>(N) * OC), two(one.size()), row(OC);
  const int prev = omp_get_max_threads();
  omp_set_num_threads(1);
  bw.matmul(one.data(), x.data(), w.data(), N, C, OC);
  omp_set_num_threads(2);
  bw.matmul(two.data(), x.data(), w.data(), N, C, OC);
  omp_set_num_threads(prev);
  EXPECT_EQ(one, two);
  bw.matmul(row.data(), x.data() + size_t(100) * C, w.data(), 1, C, OC);
  EXPECT_EQ(0, std::memcmp(row.data(), one.data() + size_t(100) * OC, sizeof(float) * OC));
  EXPECT_EQ(bw.packed_bytes(), size_t(OC) * C * 2);  // packed once, reused
}

TEST_F(Bf16WeightsTest, MatmulForwardUsesItOnlyInsideTheScope) {
  const int N = 9, C = 40, OC = 24;
  auto x = randn(static_cast<size_t>(N) * C, 5), w = randn(static_cast<size_t>(OC) * C, 6);
  Bf16Weights bw;
  std::vector<float> fp32(static_cast<size_t>(N) * OC), bf16(fp32.size()), scoped(fp32.size()), inv(fp32.size());
  matmul_forward(fp32.data(), x.data(), w.data(), N, C, OC);
  bw.matmul(bf16.data(), x.data(), w.data(), N, C, OC);
  {
    Bf16WeightsScope scope(&bw);
    EXPECT_EQ(bf16_weights(), &bw);
    matmul_forward(scoped.data(), x.data(), w.data(), N, C, OC);
    BatchInvariantScope invariant(true);  // the decode steps' kernels stay fp32
    matmul_forward(inv.data(), x.data(), w.data(), N, C, OC);
  }
  EXPECT_EQ(bf16_weights(), nullptr);
  EXPECT_EQ(scoped, bf16);
  EXPECT_NE(scoped, fp32);
  std::vector<float> inv_ref(fp32.size());
  {
    BatchInvariantScope invariant(true);
    matmul_forward(inv_ref.data(), x.data(), w.data(), N, C, OC);
  }
  EXPECT_EQ(inv, inv_ref);
}

}  // namespace
}  // namespace troupe::kernels
