// LoRA's ops (lora.h) and the dX-only matmul backward: fp64 central finite differences of
// lora_backward, fp32 against fp64, the backend table against the CPU functions, one or two rows
// (a decode step) on batch-invariant mode's chains in every mode, and
// matmul_backward_input bit for bit the input gradient of the full matmul_backward.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/lora.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels {
namespace {

template <class T>
std::vector<T> random_vec(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(g));
  return v;
}

constexpr int N = 7, C = 11, OC = 9, R = 3;
constexpr double kScale = 1.7;

// loss = sum(w * out), out = lora_forward over zeros.
double loss(const std::vector<double>& x, const std::vector<double>& A, const std::vector<double>& B,
            const std::vector<double>& w) {
  std::vector<double> out(N * OC, 0.0), scratch(lora_scratch_floats(N, R));
  lora_forward(out.data(), x.data(), A.data(), B.data(), scratch.data(), N, C, OC, R, kScale);
  double L = 0;
  for (size_t i = 0; i < out.size(); ++i) L += w[i] * out[i];
  return L;
}

TEST(Lora, FiniteDifferencesFp64) {
  auto x = random_vec<double>(N * C, 1), A = random_vec<double>(R * C, 2), B = random_vec<double>(OC * R, 3),
       w = random_vec<double>(N * OC, 4);
  std::vector<double> dx(N * C, 0.0), dA(R * C, 0.0), dB(OC * R, 0.0), scratch(lora_scratch_floats(N, R));
  lora_backward(dx.data(), dA.data(), dB.data(), w.data(), x.data(), A.data(), B.data(), scratch.data(), N, C, OC, R,
                kScale);
  auto fd = [&](std::vector<double>& p, const std::vector<double>& g, const char* name) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double orig = p[i], h = 1e-6;
      p[i] = orig + h;
      const double lp = loss(x, A, B, w);
      p[i] = orig - h;
      const double lm = loss(x, A, B, w);
      p[i] = orig;
      EXPECT_NEAR(g[i], (lp - lm) / (2 * h), 1e-6 * (1 + std::fabs(g[i]))) << name << "[" << i << "]";
    }
  };
  fd(x, dx, "dx");
  fd(A, dA, "dA");
  fd(B, dB, "dB");
}

TEST(Lora, Fp32MatchesFp64AndBackendTable) {
  auto x = random_vec<float>(N * C, 5), A = random_vec<float>(R * C, 6), B = random_vec<float>(OC * R, 7),
       dy = random_vec<float>(N * OC, 8), out0 = random_vec<float>(N * OC, 9), dx0 = random_vec<float>(N * C, 10);
  std::vector<double> xd(x.begin(), x.end()), Ad(A.begin(), A.end()), Bd(B.begin(), B.end()), dyd(dy.begin(), dy.end());
  std::vector<double> outd(out0.begin(), out0.end()), dxd(dx0.begin(), dx0.end()), dAd(R * C, 0.0), dBd(OC * R, 0.0),
      sd(lora_scratch_floats(N, R));
  lora_forward(outd.data(), xd.data(), Ad.data(), Bd.data(), sd.data(), N, C, OC, R, kScale);
  lora_backward(dxd.data(), dAd.data(), dBd.data(), dyd.data(), xd.data(), Ad.data(), Bd.data(), sd.data(), N, C, OC,
                R, kScale);
  // The cpu backend's table (what the model calls) against the fp64 specification.
  const Backend& be = cpu_backend();
  std::vector<float> out = out0, dx = dx0, dA(R * C, 0.0f), dB(OC * R, 0.0f), s(lora_scratch_floats(N, R));
  be.lora_forward(out.data(), x.data(), A.data(), B.data(), s.data(), N, C, OC, R, static_cast<float>(kScale));
  be.lora_backward(dx.data(), dA.data(), dB.data(), dy.data(), x.data(), A.data(), B.data(), s.data(), N, C, OC, R,
                   static_cast<float>(kScale));
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], outd[i], 1e-4 * (1 + std::fabs(outd[i])));
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], dxd[i], 1e-4 * (1 + std::fabs(dxd[i])));
  for (size_t i = 0; i < dA.size(); ++i) EXPECT_NEAR(dA[i], dAd[i], 1e-4 * (1 + std::fabs(dAd[i])));
  for (size_t i = 0; i < dB.size(); ++i) EXPECT_NEAR(dB[i], dBd[i], 1e-4 * (1 + std::fabs(dBd[i])));
  // No input gradient asked: dA and dB unchanged.
  std::vector<float> dA2(R * C, 0.0f), dB2(OC * R, 0.0f);
  be.lora_backward(nullptr, dA2.data(), dB2.data(), dy.data(), x.data(), A.data(), B.data(), s.data(), N, C, OC, R,
                   static_cast<float>(kScale));
  EXPECT_EQ(dA2, dA);
  EXPECT_EQ(dB2, dB);
}

// One or two rows (a decode step) take small_gemm's chains in every mode: the bits batch-invariant
// mode gives (so a sampler and a batch-invariant recompute agree), within fp32 rounding of fp64,
// on a decode-sized layer (C 576, OC 1536, rank 8, the K tails of rank 3 and C 11 too).
TEST(Lora, OneOrTwoRowsAreTheBatchInvariantChains) {
  struct Case { int rows, in, out, r; };
  for (const Case c : {Case{1, 576, 1536, 8}, Case{2, 576, 1536, 8}, Case{1, C, OC, R}, Case{2, C, OC, R}}) {
    auto x = random_vec<float>(size_t(c.rows) * c.in, 21), A = random_vec<float>(size_t(c.r) * c.in, 22),
         B = random_vec<float>(size_t(c.out) * c.r, 23), out0 = random_vec<float>(size_t(c.rows) * c.out, 24);
    std::vector<float> s(lora_scratch_floats(c.rows, c.r)), fast = out0, invariant = out0;
    lora_forward(fast.data(), x.data(), A.data(), B.data(), s.data(), c.rows, c.in, c.out, c.r, float(kScale));
    {
      const BatchInvariantScope scope(true);
      lora_forward(invariant.data(), x.data(), A.data(), B.data(), s.data(), c.rows, c.in, c.out, c.r, float(kScale));
    }
    EXPECT_EQ(fast, invariant) << "rows " << c.rows << " in " << c.in;
    std::vector<double> xd(x.begin(), x.end()), Ad(A.begin(), A.end()), Bd(B.begin(), B.end()),
        ref(out0.begin(), out0.end()), sd(lora_scratch_floats(c.rows, c.r));
    lora_forward(ref.data(), xd.data(), Ad.data(), Bd.data(), sd.data(), c.rows, c.in, c.out, c.r, kScale);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(fast[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << i;
  }
}

TEST(Lora, MatmulBackwardInputIsTheFullBackwardsInputGradient) {
  for (const char* name : {"cpu", "cpu_fenced"}) {
    const Backend& be = **backend_for(std::string_view(name));
    for (int rows : {1, 2, 70}) {
      const int Cin = 96, Cout = 80;
      auto x = random_vec<float>(static_cast<size_t>(rows) * Cin, 11), W = random_vec<float>(Cout * Cin, 12),
           dy = random_vec<float>(static_cast<size_t>(rows) * Cout, 13), dx0 = random_vec<float>(static_cast<size_t>(rows) * Cin, 14);
      auto up = [&](const std::vector<float>& h) {
        Buffer b = be.alloc(h.size() * sizeof(float)).value();
        be.copy_host_to_device(b.data(), h.data(), h.size() * sizeof(float));
        return b;
      };
      Buffer bx = up(x), bW = up(W), bdy = up(dy), dxa = up(dx0), dxb = up(dx0), dW = up(std::vector<float>(W.size()));
      be.matmul_backward(dxa.floats(), dW.floats(), bdy.floats(), bx.floats(), bW.floats(), rows, Cin, Cout);
      be.matmul_backward_input(dxb.floats(), bdy.floats(), bW.floats(), rows, Cin, Cout);
      std::vector<float> a(dx0.size()), b(dx0.size());
      be.copy_device_to_host(a.data(), dxa.data(), a.size() * sizeof(float));
      be.copy_device_to_host(b.data(), dxb.data(), b.size() * sizeof(float));
      EXPECT_EQ(a, b) << name << " rows " << rows;
    }
  }
}

}  // namespace
}  // namespace troupe::kernels
