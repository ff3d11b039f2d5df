// kernels.quant_matmul_bodies_on_host: the quant kernel bodies (cuda/bodies/quant_matmul.h) run on
// the host over their device grid (host_grid.h, 1, 5 and 32 lanes) against the CPU quant ops, every
// format: each decoded value is the CPU's dequantization bit for bit, the outputs match to the
// rounding of a reordered sum, and nothing is written outside the outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bodies/host_grid.h"
#include "bodies/quant_matmul.h"
#include "troupe/kernels/quant_matrix.h"

namespace troupe::kernels::cuda {
namespace {

constexpr QuantFormat kFormats[] = {QuantFormat::q8_0, QuantFormat::q4_0, QuantFormat::q4_1, QuantFormat::q4_k,
                                    QuantFormat::bf16};
constexpr size_t kPad = 16;
constexpr float kSentinel = -777.0f;

std::vector<float> normal(size_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

// n values (init) between guard bands of sentinels.
std::vector<float> guarded(const std::vector<float>& init) {
  std::vector<float> v(init.size() + 2 * kPad, kSentinel);
  std::copy(init.begin(), init.end(), v.begin() + kPad);
  return v;
}
void expect_guards(const std::vector<float>& v, const std::string& what) {
  for (size_t i = 0; i < kPad; ++i) {
    EXPECT_EQ(v[i], kSentinel) << what << ": a write before the buffer";
    EXPECT_EQ(v[v.size() - 1 - i], kSentinel) << what << ": a write past the buffer";
  }
}

TEST(QuantBodiesOnHost, ValuesAreTheCpuDequantization) {
  const int rows = 3, cols = 512;
  for (QuantFormat f : kFormats) {
    auto m = quantize_rows(f, normal(size_t(rows) * cols, 1, 0.3f).data(), rows, cols).value();
    std::vector<float> ref(size_t(rows) * cols);
    dequantize_rows(m.view(), 0, rows, ref.data());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const float v = quant_value(f, m.bytes.data() + r * m.view().row_bytes(), c);
        ASSERT_EQ(std::memcmp(&v, &ref[size_t(r) * cols + c], 4), 0) << enum_string(f) << " (" << r << ", " << c << ")";
      }
  }
}

TEST(QuantBodiesOnHost, ForwardAndBackwardInputMatchTheCpuOps) {
  const int T = 2, N = 24;
  for (QuantFormat f : kFormats) {
    const int K = quant_block_values(f) == 256 ? 256 : 64;  // one q4_k block, two of the others
    const auto m = quantize_rows(f, normal(size_t(N) * K, 2, 0.05f).data(), N, K).value();
    const auto x = normal(size_t(T) * K, 3, 1.0f), dy = normal(size_t(T) * N, 4, 1.0f), dx0 = normal(size_t(T) * K, 5, 1.0f);
    std::vector<float> yref(size_t(T) * N), dxref = dx0;
    quant_matmul_forward(yref.data(), x.data(), m.view(), T);
    quant_matmul_backward_input(dxref.data(), dy.data(), m.view(), T);
    for (int lanes : {1, 5, 32}) {
      const std::string what = enum_string(f) + " lanes=" + std::to_string(lanes);
      auto y = guarded(std::vector<float>(yref.size(), 0.0f)), dx = guarded(dx0);
      host_for_rows(QuantMatmulForwardBody{y.data() + kPad, x.data(), m.bytes.data(), m.view().row_bytes(), f, N, K}, T * N,
                    lanes);
      host_for_rows(QuantMatmulBackwardInputBody{dx.data() + kPad, dy.data(), m.bytes.data(), m.view().row_bytes(), f, N, K},
                    T * K, lanes);
      expect_guards(y, what + " forward");
      expect_guards(dx, what + " backward");
      for (size_t i = 0; i < yref.size(); ++i) ASSERT_NEAR(y[kPad + i], yref[i], 2e-5f * (1 + std::fabs(yref[i]))) << what;
      for (size_t i = 0; i < dxref.size(); ++i) ASSERT_NEAR(dx[kPad + i], dxref[i], 2e-5f * (1 + std::fabs(dxref[i]))) << what;
    }
  }
}

}  // namespace
}  // namespace troupe::kernels::cuda
