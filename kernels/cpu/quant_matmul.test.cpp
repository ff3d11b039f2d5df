// kernels.quant_matmul: the quantized weight formats (quant_matrix.h) and the quant ops. Shapes
// that are not whole blocks are refused naming the shape; quantize -> dequantize stays within each
// format's rounding bound; quant_matmul_forward / backward_input equal matmul_forward / backward on
// the dequantized W bit for bit where the blocks of work agree (T <= 64, decode and batch-invariant
// chains) and within 1e-6 of the sum of |terms| elsewhere; dx matches finite differences; the
// results do not depend on the thread count; the cpu and cpu_fenced backends give the same bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant_chain.h"
#include "troupe/kernels/backend.h"
#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/lora.h"
#include "troupe/kernels/ops.h"
#include "troupe/kernels/quant_matrix.h"

namespace k = troupe::kernels;
using k::QuantFormat;

namespace {

constexpr QuantFormat kFormats[] = {QuantFormat::q8_0, QuantFormat::q4_0, QuantFormat::q4_1, QuantFormat::q4_k,
                                    QuantFormat::bf16};

std::vector<float> normal(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

k::QuantMatrix quantize(QuantFormat f, const std::vector<float>& w, int rows, int cols) {
  auto m = k::quantize_rows(f, w.data(), rows, cols);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return std::move(m).value();
}

std::vector<float> dequantized(const k::QuantMatrix& m) {
  std::vector<float> w(static_cast<size_t>(m.rows) * m.cols);
  k::dequantize_rows(m.view(), 0, m.rows, w.data());
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string name(QuantFormat f) { return troupe::enum_string(f); }

TEST(QuantMatmul, FormatsAndNames) {
  EXPECT_EQ(k::quant_block_values(QuantFormat::q4_k), 256);
  EXPECT_EQ(k::quant_block_bytes(QuantFormat::q4_k), 144);
  EXPECT_EQ(k::quant_row_bytes(QuantFormat::q4_1, 576), 18u * 20u);
  EXPECT_EQ(k::quant_row_bytes(QuantFormat::bf16, 10), 20u);
  for (QuantFormat f : kFormats) EXPECT_EQ(troupe::enum_from_name<QuantFormat>(name(f)), f);
}

TEST(QuantMatmul, OddShapesAreRefusedNamingTheShape) {
  std::vector<float> w(8 * 300, 1.0f);
  auto r = k::quantize_rows(QuantFormat::q4_k, w.data(), 8, 100);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("q4_k: a (8, 100) matrix: 100 columns are not a multiple of the 256-value block"),
            std::string::npos)
      << r.error().message;
  auto r2 = k::quantize_rows(QuantFormat::q8_0, w.data(), 3, 33);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().message.find("(3, 33)"), std::string::npos) << r2.error().message;
  EXPECT_FALSE(k::quantize_rows(QuantFormat::q4_0, w.data(), 0, 32).ok());
  auto r3 = k::quant_matrix_from_blocks(QuantFormat::q4_1, 2, 64, w.data(), 79, "model.gguf: tensor 'x'");
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.error().message, "model.gguf: tensor 'x': 79 bytes of blocks, q4_1 (2, 64) needs 80");
  auto r4 = k::quant_matrix_from_blocks(QuantFormat::q4_1, 2, 64, w.data(), 80, "t");
  ASSERT_TRUE(r4.ok());
  EXPECT_EQ(r4.value().bytes.size(), 80u);
}

// Per 32-value block (q4_k: per sub-block, against the super-block's largest range), the largest
// error round to nearest allows, with fp16 scales.
TEST(QuantMatmul, QuantizeDequantizeErrorBounds) {
  const int rows = 6, cols = 512;
  std::vector<float> w = normal(static_cast<size_t>(rows) * cols, 7);
  for (int c = 0; c < 32; ++c) w[c] = 0.0f;          // an all-zero block
  for (int c = 32; c < 64; ++c) w[c] = 0.25f;        // a constant block
  for (int c = 64; c < 96; ++c) w[c] = -3.0f + c % 5;  // few levels
  for (QuantFormat f : kFormats) {
    const auto m = quantize(f, w, rows, cols);
    const auto back = dequantized(m);
    for (int r = 0; r < rows; ++r)
      for (int b = 0; b < cols / 32; ++b) {
        const float* x = w.data() + static_cast<size_t>(r) * cols + 32 * b;
        const float* y = back.data() + static_cast<size_t>(r) * cols + 32 * b;
        float amax = 0, mn = x[0], mx = x[0];
        for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[l])), mn = std::min(mn, x[l]), mx = std::max(mx, x[l]);
        double bound = 0;
        switch (f) {
          case QuantFormat::q8_0: bound = amax / 127.0 * 0.5 + amax * 1e-3; break;
          case QuantFormat::q4_0: bound = amax / 8.0 + amax * 1e-2; break;  // the +8 end is clamped to 15
          case QuantFormat::q4_1: bound = (mx - mn) / 15.0 * 0.5 + amax * 2e-3; break;
          case QuantFormat::q4_k: {  // the 6-bit scales add up to half a step of 63 of the largest range
            float smax = 0;
            for (int l = 0; l < 256; ++l) smax = std::max(smax, std::fabs(w[static_cast<size_t>(r) * cols + 256 * (b / 8) + l]));
            bound = (mx - std::min(mn, 0.0f)) / 15.0 * 0.5 + 2.0 * smax / 63.0 + amax * 1e-2;
            break;
          }
          case QuantFormat::bf16: bound = amax / 256.0; break;
        }
        for (int l = 0; l < 32; ++l)
          ASSERT_LE(std::fabs(double(x[l]) - y[l]), bound) << name(f) << " row " << r << " value " << 32 * b + l;
        // A zero block comes back exactly; so does the constant one where the scale is a power of
        // two (q4_0), the min holds it (q4_1) or the value is a bf16 (bf16).
        const bool exact_constant = f == QuantFormat::q4_0 || f == QuantFormat::q4_1 || f == QuantFormat::bf16;
        if (r == 0 && (b == 0 || (b == 1 && exact_constant))) {
          for (int l = 0; l < 32; ++l) ASSERT_EQ(x[l], y[l]) << name(f) << " block " << b;
        }
      }
  }
}

// A q4_k block written by hand: two sub-blocks with scales/mins past 15 (the packed high bits).
TEST(QuantMatmul, Q4kLayoutByHand) {
  std::vector<uint8_t> b(144, 0);
  const uint16_t one = 0x3C00, half = 0x3800;  // d = 1, dmin = 0.5
  std::memcpy(b.data(), &one, 2), std::memcpy(b.data() + 2, &half, 2);
  // sub-block 5: sc = 37 (0b100101), m = 50 (0b110010): low nibbles in byte 9, high bits in 1 and 5.
  b[4 + 9] = static_cast<uint8_t>((37 & 0xF) | ((50 & 0xF) << 4));
  b[4 + 1] = static_cast<uint8_t>((37 >> 4) << 6);
  b[4 + 5] = static_cast<uint8_t>((50 >> 4) << 6);
  b[4 + 0] = 3, b[4 + 4] = 2;  // sub-block 0: sc = 3, m = 2
  b[16 + 0] = 0x7A;            // value 0 (sub-block 0): q = 0xA; value 32 (sub-block 1): q = 7
  b[16 + 64 + 3] = 0xC0;       // sub-block 5 = the high nibbles of bytes 64..95: value 160 + 3 has q = 12
  auto m = k::quant_matrix_from_blocks(QuantFormat::q4_k, 1, 256, b.data(), b.size(), "hand");
  ASSERT_TRUE(m.ok());
  const auto y = dequantized(m.value());
  EXPECT_EQ(y[0], 1.0f * 3 * 10 - 0.5f * 2);
  EXPECT_EQ(y[32], 0.0f);  // sub-block 1 has scale 0 and min 0
  EXPECT_EQ(y[163], 37.0f * 12 - 0.5f * 50);
  EXPECT_EQ(y[160], -25.0f);
}

struct Shape {
  int T, N, K;  // tokens, W rows (outputs), W cols (inputs)
};

// y through matmul_forward on the dequantized W, and dx0 + dy W through matmul_backward.
std::vector<float> fp32_forward(const std::vector<float>& x, const std::vector<float>& w, const Shape& s) {
  std::vector<float> y(static_cast<size_t>(s.T) * s.N);
  k::matmul_forward(y.data(), x.data(), w.data(), s.T, s.K, s.N);
  return y;
}
std::vector<float> fp32_backward(std::vector<float> dx, const std::vector<float>& dy, const std::vector<float>& w,
                                 const Shape& s) {
  k::matmul_backward<float>(dx.data(), nullptr, dy.data(), nullptr, w.data(), s.T, s.K, s.N);
  return dx;
}
std::vector<float> q_forward(const std::vector<float>& x, const k::QuantMatrix& m, int T) {
  std::vector<float> y(static_cast<size_t>(T) * m.rows, 123.0f);
  k::quant_matmul_forward(y.data(), x.data(), m.view(), T);
  return y;
}
std::vector<float> q_backward(std::vector<float> dx, const std::vector<float>& dy, const k::QuantMatrix& m, int T) {
  k::quant_matmul_backward_input(dx.data(), dy.data(), m.view(), T);
  return dx;
}

// |a - b| <= 1e-6 * sum_k |a_k b_k| + 1e-30 per element (the rounding of a reordered fp32 sum).
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& scale,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(double(got[i]) - ref[i]), 1e-6 * scale[i] + 1e-30) << what << " element " << i;
}
std::vector<double> abs_forward(const std::vector<float>& x, const std::vector<float>& w, const Shape& s) {
  std::vector<double> out(static_cast<size_t>(s.T) * s.N);
  for (int t = 0; t < s.T; ++t)
    for (int o = 0; o < s.N; ++o) {
      double a = 0;
      for (int c = 0; c < s.K; ++c) a += std::fabs(double(x[size_t(t) * s.K + c]) * w[size_t(o) * s.K + c]);
      out[size_t(t) * s.N + o] = a;
    }
  return out;
}
std::vector<double> abs_backward(const std::vector<float>& dx0, const std::vector<float>& dy, const std::vector<float>& w,
                                 const Shape& s) {
  std::vector<double> out(static_cast<size_t>(s.T) * s.K);
  for (int t = 0; t < s.T; ++t)
    for (int c = 0; c < s.K; ++c) {
      double a = std::fabs(dx0[size_t(t) * s.K + c]);
      for (int o = 0; o < s.N; ++o) a += std::fabs(double(dy[size_t(t) * s.N + o]) * w[size_t(o) * s.K + c]);
      out[size_t(t) * s.K + c] = a;
    }
  return out;
}

// Decode (T = 1, 2), few tokens against wide W (column blocks), a narrow or small W (whole-W
// dequantization), T = 64 and T = 100 (tiles of W against blocks of tokens).
const Shape kShapes[] = {{1, 1536, 576}, {2, 576, 1536}, {1, 192, 576}, {3, 1536, 576}, {64, 576, 512},
                         {1, 48, 256},   {64, 32, 256},  {100, 96, 256}, {100, 640, 512}, {7, 64, 768}};

TEST(QuantMatmul, ForwardAndBackwardMatchFp32OnTheDequantizedWeights) {
  for (QuantFormat f : kFormats)
    for (const Shape& s : kShapes) {
      if (s.K % k::quant_block_values(f) != 0) continue;
      const std::string what = name(f) + " T=" + std::to_string(s.T) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
      const auto m = quantize(f, normal(size_t(s.N) * s.K, 11, 0.05f), s.N, s.K);
      const auto w = dequantized(m);
      const auto x = normal(size_t(s.T) * s.K, 12), dy = normal(size_t(s.T) * s.N, 13), dx0 = normal(size_t(s.T) * s.K, 14);
      const auto y = q_forward(x, m, s.T), yref = fp32_forward(x, w, s);
      const auto dx = q_backward(dx0, dy, m, s.T), dxref = fp32_backward(dx0, dy, w, s);
      if (s.T <= k::kGemmRowBlock) {  // the same blocks of work as gemm_blocked: the same bits
        EXPECT_TRUE(same_bits(y, yref)) << what;
        EXPECT_TRUE(same_bits(dx, dxref)) << what;
      }
      expect_close(y, yref, abs_forward(x, w, s), what + " forward");
      expect_close(dx, dxref, abs_backward(dx0, dy, w, s), what + " backward");
    }
}

TEST(QuantMatmul, BatchInvariantModeMatchesFp32) {
  const troupe::kernels::BatchInvariantScope scope(true);
  for (QuantFormat f : kFormats)
    for (const Shape s : {Shape{1, 1536, 576}, Shape{5, 576, 1536}, Shape{70, 96, 512}}) {
      if (s.K % k::quant_block_values(f) != 0) continue;
      const auto m = quantize(f, normal(size_t(s.N) * s.K, 21, 0.05f), s.N, s.K);
      const auto x = normal(size_t(s.T) * s.K, 22);
      EXPECT_TRUE(same_bits(q_forward(x, m, s.T), fp32_forward(x, dequantized(m), s))) << name(f) << " T=" << s.T;
    }
}

TEST(QuantMatmul, BitsDoNotDependOnTheThreadCount) {
  const int saved = omp_get_max_threads();
  for (const Shape s : {Shape{1, 1536, 512}, Shape{16, 1536, 512}, Shape{100, 640, 512}})
    for (QuantFormat f : {QuantFormat::q4_1, QuantFormat::q4_k}) {
      const auto m = quantize(f, normal(size_t(s.N) * s.K, 31, 0.05f), s.N, s.K);
      const auto x = normal(size_t(s.T) * s.K, 32), dy = normal(size_t(s.T) * s.N, 33);
      const std::vector<float> dx0(size_t(s.T) * s.K, 0.5f);
      omp_set_num_threads(1);
      const auto y1 = q_forward(x, m, s.T), dx1 = q_backward(dx0, dy, m, s.T);
      for (int threads : {2, 3}) {
        omp_set_num_threads(threads);
        EXPECT_TRUE(same_bits(q_forward(x, m, s.T), y1)) << name(f) << " T=" << s.T << " threads=" << threads;
        EXPECT_TRUE(same_bits(q_backward(dx0, dy, m, s.T), dx1)) << name(f) << " T=" << s.T << " threads=" << threads;
      }
    }
  omp_set_num_threads(saved);
}

// L = sum(g . y), y = x W^T: dL/dx = g W, against central differences of L in fp64.
TEST(QuantMatmul, InputGradientMatchesFiniteDifferences) {
  for (QuantFormat f : kFormats) {
    const Shape s{3, 40, 256};
    const auto m = quantize(f, normal(size_t(s.N) * s.K, 41, 0.1f), s.N, s.K);
    const auto w = dequantized(m);
    const auto x = normal(size_t(s.T) * s.K, 42), g = normal(size_t(s.T) * s.N, 43);
    const auto dx = q_backward(std::vector<float>(x.size(), 0.0f), g, m, s.T);
    auto loss = [&](const std::vector<double>& xd) {
      double L = 0;
      for (int t = 0; t < s.T; ++t)
        for (int o = 0; o < s.N; ++o) {
          double yo = 0;
          for (int c = 0; c < s.K; ++c) yo += xd[size_t(t) * s.K + c] * w[size_t(o) * s.K + c];
          L += g[size_t(t) * s.N + o] * yo;
        }
      return L;
    };
    std::vector<double> xd(x.begin(), x.end());
    for (size_t i : {size_t(0), size_t(37), size_t(300), size_t(767)}) {
      const double h = 1e-3, x0 = xd[i];
      xd[i] = x0 + h;
      const double lp = loss(xd);
      xd[i] = x0 - h;
      const double lm = loss(xd);
      xd[i] = x0;
      EXPECT_NEAR(dx[i], (lp - lm) / (2 * h), 1e-4 * (1 + std::fabs(dx[i]))) << name(f) << " x[" << i << "]";
    }
  }
}

// A group of projections of one input (a layer's q, k, v with rank-8 adapters on two of them)
// gives the bits of its quant_matmul_forward and lora_forward calls one by one: decode steps (1
// and 2 tokens, split over threads or not, batch-invariant or not) and a prefill (fallback).
TEST(QuantMatmul, ProjectionGroupEqualsTheCallsOneByOne) {
  const int C = 576, r = 8;
  const int rows[3] = {576, 192, 192};
  std::vector<k::QuantMatrix> m;
  std::vector<std::vector<float>> A, B;
  for (int i = 0; i < 3; ++i) {
    m.push_back(quantize(QuantFormat::q4_1, normal(size_t(rows[i]) * C, 61 + i, 0.05f), rows[i], C));
    A.push_back(normal(size_t(r) * C, 71 + i, 0.05f));
    B.push_back(normal(size_t(rows[i]) * r, 81 + i, 0.05f));
  }
  const int saved = omp_get_max_threads();
  for (bool invariant : {false, true})
    for (int T : {1, 2, 9})
      for (int threads : {1, 2}) {
        const troupe::kernels::BatchInvariantScope scope(invariant);
        omp_set_num_threads(threads);
        const auto x = normal(size_t(T) * C, 91 + T);
        std::vector<std::vector<float>> want(3), have(3);
        std::vector<float> scratch(k::lora_scratch_floats(T, r));
        k::QuantProjection p[3];
        for (int i = 0; i < 3; ++i) {
          want[i].assign(size_t(T) * rows[i], 0.0f);
          have[i].assign(size_t(T) * rows[i], 0.0f);
          k::quant_matmul_forward(want[i].data(), x.data(), m[i].view(), T);
          p[i].y = have[i].data();
          p[i].W = m[i].view();
          if (i == 1) continue;  // k without an adapter
          k::lora_forward(want[i].data(), x.data(), A[i].data(), B[i].data(), scratch.data(), T, C, rows[i], r, 2.0f);
          p[i].A = A[i].data(), p[i].B = B[i].data(), p[i].scratch = scratch.data(), p[i].r = r, p[i].scale = 2.0f;
        }
        k::quant_projections_forward(p, 3, x.data(), T);
        for (int i = 0; i < 3; ++i)
          EXPECT_TRUE(same_bits(have[i], want[i])) << "projection " << i << " T=" << T << " threads=" << threads
                                                   << " invariant=" << invariant;
      }
  omp_set_num_threads(saved);
}

// The AVX-512F two-row chains (two rows of W per register, 4-bit values through a per-block table)
// and the AVX2 chain give the same bits, every format, 1 and 2 tokens, row counts with every tail
// (pairs of four, single pairs, a last odd row), the q8_0 LM head's shape included.
TEST(QuantMatmul, TwoRowChainsEqualTheAvx2Chain) {
  if (!k::quant_chain::two_row_active()) GTEST_SKIP() << "no AVX-512F: the ops run the AVX2 chain only";
  const troupe::kernels::BatchInvariantScope scope(true);  // the chain for every shape
  for (QuantFormat f : kFormats)
    for (const Shape s : {Shape{1, 4099, 512}, Shape{2, 77, 512}, Shape{1, 13, 256}, Shape{2, 6, 768}}) {
      const auto m = quantize(f, normal(size_t(s.N) * s.K, 51, 0.05f), s.N, s.K);
      const auto x = normal(size_t(s.T) * s.K, 52);
      const auto wide = q_forward(x, m, s.T);
      k::quant_chain::allow_two_row(false);
      const auto avx2 = q_forward(x, m, s.T);
      k::quant_chain::allow_two_row(true);
      EXPECT_TRUE(same_bits(wide, avx2)) << name(f) << " T=" << s.T << " N=" << s.N;
      EXPECT_TRUE(same_bits(wide, fp32_forward(x, dequantized(m), s))) << name(f) << " T=" << s.T << " N=" << s.N;
    }
}

// The backend table: cpu and cpu_fenced (W's blocks in a device buffer) give the CPU op's bits.
TEST(QuantMatmul, BackendsRunTheOps) {
  for (const char* dev : {"cpu", "cpu_fenced"}) {
    auto b = k::backend_for(dev);
    ASSERT_TRUE(b.ok());
    const k::Backend& be = *b.value();
    for (const Shape s : {Shape{1, 1536, 576}, Shape{64, 192, 512}}) {
      const auto m = quantize(QuantFormat::q4_1, normal(size_t(s.N) * s.K, 51, 0.05f), s.N, s.K);
      const auto x = normal(size_t(s.T) * s.K, 52), dy = normal(size_t(s.T) * s.N, 53), dx0 = normal(size_t(s.T) * s.K, 54);
      auto wb = be.alloc(m.bytes.size()).value();
      auto xb = be.alloc(x.size() * 4).value(), yb = be.alloc(dy.size() * 4).value();
      auto dyb = be.alloc(dy.size() * 4).value(), dxb = be.alloc(x.size() * 4).value();
      be.copy_host_to_device(wb.data(), m.bytes.data(), m.bytes.size());
      be.copy_host_to_device(xb.data(), x.data(), x.size() * 4);
      be.copy_host_to_device(dyb.data(), dy.data(), dy.size() * 4);
      be.copy_host_to_device(dxb.data(), dx0.data(), dx0.size() * 4);
      k::QuantWeights W = m.view();
      W.data = wb.data();
      be.quant_matmul_forward(yb.floats(), xb.floats(), W, s.T);
      be.quant_matmul_backward_input(dxb.floats(), dyb.floats(), W, s.T);
      std::vector<float> y(dy.size()), dx(x.size());
      be.copy_device_to_host(y.data(), yb.data(), y.size() * 4);
      be.copy_device_to_host(dx.data(), dxb.data(), dx.size() * 4);
      EXPECT_TRUE(same_bits(y, q_forward(x, m, s.T))) << dev << " T=" << s.T;
      EXPECT_TRUE(same_bits(dx, q_backward(dx0, dy, m, s.T))) << dev << " T=" << s.T;
    }
  }
}

}  // namespace
