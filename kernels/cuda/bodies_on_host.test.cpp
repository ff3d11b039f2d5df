// kernels.cuda_bodies_on_host: every CUDA kernel body (kernels/cuda/bodies/*.h), run on the CPU by
// host_grid.h over the grid its kernel uses, against the CPU op it implements (ops.h, moe.h,
// chunked_logprob.h, grpo_loss.h, random.h). Outputs sit between sentinel guards that must stay
// untouched (out-of-bounds writes), values must match to atol + rtol*|ref| with NaN/Inf parity.
// Row bodies run with 1, 5 and 32 lanes (a non-power-of-two tree and a warp's worth). This checks
// indexing and math; it does not run the GPU (tests/gpu/ does, where one exists).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "bodies/attention.h"
#include "bodies/bf16.h"
#include "bodies/chunked_logprob.h"
#include "bodies/elementwise.h"
#include "bodies/embedding.h"
#include "bodies/flash_attention.h"
#include "bodies/gemm_args.h"
#include "bodies/grpo_loss.h"
#include "bodies/host_exec.h"
#include "bodies/host_grid.h"
#include "bodies/moe_layer.h"
#include "bodies/rmsnorm.h"
#include "bodies/rope.h"
#include "bodies/sampling.h"
#include "troupe/kernels/backend.h"
#include "troupe/kernels/chunked_logprob.h"
#include "troupe/kernels/grpo_loss.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/ops.h"
#include "troupe/kernels/random.h"

namespace troupe::kernels::cuda {
namespace {

namespace k = troupe::kernels;

constexpr int kPad = 16;
constexpr uint32_t kSentinelBits = 0x7fc0beefu;  // a NaN no op writes

// n values between two guard bands of sentinels.
template <class T>
class Guarded {
 public:
  explicit Guarded(size_t n, T init = T(0)) : n_(n), v_(n + 2 * kPad) {
    for (size_t i = 0; i < kPad; ++i) v_[i] = v_[n + kPad + i] = sentinel();
    std::fill(v_.begin() + kPad, v_.begin() + kPad + static_cast<long>(n), init);
  }
  Guarded(const std::vector<T>& from) : Guarded(from.size()) { std::copy(from.begin(), from.end(), data()); }
  T* data() { return v_.data() + kPad; }
  const T* data() const { return v_.data() + kPad; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return data()[i]; }
  std::vector<T> vec() const { return std::vector<T>(data(), data() + n_); }
  bool guards_intact() const {
    for (size_t i = 0; i < kPad; ++i)
      if (!same(v_[i]) || !same(v_[n_ + kPad + i])) return false;
    return true;
  }

 private:
  static T sentinel() {
    if constexpr (std::is_same_v<T, float>) {
      float f;
      std::memcpy(&f, &kSentinelBits, 4);
      return f;
    } else {
      return static_cast<T>(0x5eed5eed);
    }
  }
  static bool same(T x) {
    const T s = sentinel();
    return std::memcmp(&x, &s, sizeof(T)) == 0;
  }
  size_t n_;
  std::vector<T> v_;
};

template <class A, class B>
void expect_near(const char* what, const A& got, const B& ref, size_t n, double atol, double rtol) {
  int bad = 0;
  for (size_t i = 0; i < n && bad < 5; ++i) {
    const double g = got[i], r = ref[i];
    bool ok;
    if (std::isnan(r)) ok = std::isnan(g);
    else if (std::isinf(r)) ok = g == r;
    else ok = std::isfinite(g) && std::fabs(g - r) <= atol + rtol * std::fabs(r);
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << "[" << i << "]: got " << g << ", CPU op " << r;
    }
  }
}
template <class T>
void expect_guards(const char* what, const Guarded<T>& g) {
  EXPECT_TRUE(g.guards_intact()) << what << ": a write outside the buffer";
}

std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}
std::vector<int32_t> randint(size_t n, int hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

const int kLaneCounts[] = {1, 5, 32};

// ---- the cuBLAS call of a row-major GEMM ------------------------------------------------------------

// Column-major reference with BLAS's semantics: C (m, n) = alpha op(A) op(B) + beta C.
void col_major_sgemm(const ColMajorGemm& g, float alpha, float beta) {
  for (int j = 0; j < g.n; ++j)
    for (int i = 0; i < g.m; ++i) {
      double acc = 0;
      for (int p = 0; p < g.k; ++p) {
        const float a = g.trans_first ? g.first[p + static_cast<size_t>(i) * g.ld_first]
                                      : g.first[i + static_cast<size_t>(p) * g.ld_first];
        const float b = g.trans_second ? g.second[j + static_cast<size_t>(p) * g.ld_second]
                                       : g.second[p + static_cast<size_t>(j) * g.ld_second];
        acc += static_cast<double>(a) * b;
      }
      float& c = g.c[i + static_cast<size_t>(j) * g.ldc];
      c = static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * c));
    }
}

TEST(CudaBodiesOnHost, RowMajorGemmAsColumnMajorCall) {
  const int M = 7, N = 5, K = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3, ldc = N + 1;  // padded leading dims
      auto A = randn(static_cast<size_t>(ta ? K : M) * lda, 60), B = randn(static_cast<size_t>(tb ? N : K) * ldb, 61);
      auto C0 = randn(static_cast<size_t>(M) * ldc, 62);
      std::vector<float> ref = C0;
      Guarded<float> got(C0);
      k::gemm_blocked(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 1.5f, ref.data(), ldc);
      col_major_sgemm(col_major_gemm(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, got.data(), ldc), 0.5f, 1.5f);
      expect_near(ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"), got.data(), ref, ref.size(), 1e-5,
                  1e-5);
      expect_guards("gemm", got);
    }
}

// ---- elementwise family ---------------------------------------------------------------------------

// The bf16 GEMMs' operand rounding (bodies/bf16.h) against a reference that takes the nearer of
// the two bf16 neighbours in exact double arithmetic (ties to the even one); NaN stays a quiet NaN,
// infinities stay, values from the largest bf16 plus half an ulp round to infinity; a strided
// (rows, cols, ld) source packs into rows, inside its guards.
uint16_t bf16_reference(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncated toward zero
  if (std::isinf(x)) return lo;
  auto value = [](uint16_t b) {  // the bf16 as a double; the bits past the largest finite one: 2^128
    if ((b & 0x7fffu) == 0x7f80u) return std::copysign(std::ldexp(1.0, 128), (b & 0x8000u) ? -1.0 : 1.0);
    const uint32_t w = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    return static_cast<double>(f);
  };
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // one bf16 ulp further from zero
  const double d_lo = std::fabs(static_cast<double>(x) - value(lo)), d_hi = std::fabs(value(hi) - static_cast<double>(x));
  if (d_lo < d_hi) return lo;
  if (d_hi < d_lo) return hi;
  return (lo & 1u) ? hi : lo;
}

TEST(CudaBodiesOnHost, Bf16Rounding) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = bits(rng);
    float x;
    std::memcpy(&x, &u, 4);
    if (std::isnan(x)) continue;
    ASSERT_EQ(hd_bf16_bits(x), bf16_reference(x)) << std::hexfloat << x;
    ++checked;
  }
  EXPECT_GT(checked, 190000);
  for (uint32_t lo : {0x3f80u, 0x3f81u, 0xbf80u, 0xbf81u, 0x0001u, 0x7f7fu}) {  // exact ties, even and odd
    const uint32_t w = (lo << 16) | 0x8000u;
    float x;
    std::memcpy(&x, &w, 4);
    EXPECT_EQ(hd_bf16_bits(x), bf16_reference(x)) << std::hex << w;
    EXPECT_EQ(hd_bf16_bits(x) & 1u, 0u) << std::hex << w;  // ties go to even
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(hd_bf16_bits(inf), 0x7f80u);
  EXPECT_EQ(hd_bf16_bits(-inf), 0xff80u);
  EXPECT_EQ(hd_bf16_bits(std::numeric_limits<float>::max()), 0x7f80u);  // past max bf16 + half ulp
  EXPECT_EQ(hd_bf16_bits(-0.0f), 0x8000u);
  EXPECT_EQ(hd_bf16_bits(1.0f), 0x3f80u);
  const uint16_t nan = hd_bf16_bits(std::numeric_limits<float>::signaling_NaN());
  EXPECT_EQ(nan & 0x7f80u, 0x7f80u);
  EXPECT_NE(nan & 0x0040u, 0u);  // quiet
  // Packing a strided (3, 5) block with leading dimension 7.
  const size_t rows = 3, cols = 5, ld = 7;
  auto src = randn(rows * ld, 9);
  Guarded<uint16_t> dst(rows * cols);
  host_for_each(ToBf16Body{dst.data(), src.data(), cols, ld}, rows * cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) EXPECT_EQ(dst[r * cols + c], bf16_reference(src[r * ld + c]));
  EXPECT_TRUE(dst.guards_intact());
}

TEST(CudaBodiesOnHost, ElementwiseFamily) {
  const int N = 7, C = 37;
  const size_t n = static_cast<size_t>(N) * C;
  auto a = randn(n, 1), b = randn(n, 2), d = randn(n, 3), gate = randn(N, 4), bias = randn(C, 5);
  a[3] = std::numeric_limits<float>::infinity();  // Inf/NaN parity through the elementwise math
  b[5] = std::numeric_limits<float>::quiet_NaN();
  {
    Guarded<float> out(n);
    host_for_each(FillBody{out.data(), 2.5f}, n);
    std::vector<float> ref(n, 2.5f);
    expect_near("fill", out.data(), ref, n, 0, 0);
    expect_guards("fill", out);
  }
  {  // Backend::scale: the CPU backend's op (the streamed step's host loop) bit for bit
    Guarded<float> out(n);
    std::copy(a.begin(), a.end(), out.data());
    host_for_each(ScaleBody{out.data(), 1.0 / 3.0}, n);
    std::vector<float> ref(a.begin(), a.end());
    k::cpu_backend().scale(ref.data(), n, 1.0 / 3.0);
    expect_near("scale", out.data(), ref, n, 0, 0);
    expect_guards("scale", out);
  }
  {
    Guarded<float> out(n);
    std::vector<float> ref(n);
    host_for_each(AddBody{out.data(), a.data(), b.data()}, n);
    k::add_forward(ref.data(), a.data(), b.data(), n);
    expect_near("add", out.data(), ref, n, 0, 0);
    expect_guards("add", out);
  }
  {
    Guarded<float> out(n);
    std::vector<float> ref(n);
    host_for_each(LoraDropoutBody{out.data(), a.data(), 0.3f, 1.0f / (1.0f - 0.3f), 42}, n);
    k::lora_dropout(ref.data(), a.data(), n, 0.3f, 42);
    expect_near("lora_dropout", out.data(), ref, n, 0, 0);
    expect_guards("lora_dropout", out);
  }
  {
    Guarded<float> out(n), dg(n), du(n);
    std::vector<float> ref(n), rdg(n), rdu(n);
    host_for_each(SwigluForwardBody{out.data(), a.data(), b.data()}, n);
    k::swiglu_forward(ref.data(), a.data(), b.data(), static_cast<int>(n));
    expect_near("swiglu_forward", out.data(), ref, n, 1e-6, 1e-6);
    host_for_each(SwigluBackwardBody{dg.data(), du.data(), d.data(), a.data(), b.data()}, n);
    k::swiglu_backward(rdg.data(), rdu.data(), d.data(), a.data(), b.data(), static_cast<int>(n));
    expect_near("swiglu_backward.dgate", dg.data(), rdg, n, 1e-6, 1e-6);
    expect_near("swiglu_backward.dup", du.data(), rdu, n, 1e-6, 1e-6);
    for (auto* g : {&out, &dg, &du}) expect_guards("swiglu", *g);
  }
  auto x = randn(n, 6);
  {
    Guarded<float> out(x);
    std::vector<float> ref = x;
    host_for_each(BiasForwardBody{out.data(), bias.data(), C}, n);
    k::bias_forward(ref.data(), bias.data(), N, C);
    expect_near("bias_forward", out.data(), ref, n, 0, 0);
    Guarded<float> db(bias);
    std::vector<float> rdb = bias;
    host_for_each(BiasBackwardBody{db.data(), x.data(), N, C}, static_cast<size_t>(C));
    k::bias_backward(rdb.data(), x.data(), N, C);
    expect_near("bias_backward", db.data(), rdb, C, 0, 0);
    expect_guards("bias", out);
    expect_guards("bias_backward", db);
  }
  for (int lanes : kLaneCounts) {
    Guarded<float> out(n), dgate(N), dx(n);
    std::vector<float> ref(n), rdgate(N), rdx(n);
    host_for_each(SigmoidGateForwardBody{out.data(), gate.data(), x.data(), C}, n);
    k::sigmoid_gate_forward(ref.data(), gate.data(), x.data(), N, C);
    expect_near("sigmoid_gate_forward", out.data(), ref, n, 1e-6, 1e-6);
    host_for_rows(SigmoidGateBackwardBody{dgate.data(), dx.data(), d.data(), gate.data(), x.data(), C}, N, lanes);
    k::sigmoid_gate_backward(rdgate.data(), rdx.data(), d.data(), gate.data(), x.data(), N, C);
    expect_near("sigmoid_gate_backward.dgate", dgate.data(), rdgate, N, 1e-5, 1e-5);
    expect_near("sigmoid_gate_backward.dx", dx.data(), rdx, n, 1e-6, 1e-6);
    for (auto* g : {&out, &dgate, &dx}) expect_guards("sigmoid_gate", *g);
  }
}

// ---- embedding ------------------------------------------------------------------------------------

TEST(CudaBodiesOnHost, Embedding) {
  const int N = 9, C = 13, V = 5;
  auto wte = randn(static_cast<size_t>(V) * C, 7), dout = randn(static_cast<size_t>(N) * C, 8);
  auto tokens = randint(N, V, 9);
  tokens[1] = tokens[2] = tokens[7];  // repeats add in order
  Guarded<float> out(static_cast<size_t>(N) * C);
  std::vector<float> ref(static_cast<size_t>(N) * C);
  host_for_each(EmbeddingForwardBody{out.data(), tokens.data(), wte.data(), C}, out.size());
  k::embedding_forward(ref.data(), tokens.data(), wte.data(), N, C);
  expect_near("embedding_forward", out.data(), ref, out.size(), 0, 0);
  Guarded<float> dwte(wte);
  std::vector<float> rdwte = wte;
  host_for_each(EmbeddingBackwardBody{dwte.data(), dout.data(), tokens.data(), N, C}, static_cast<size_t>(C));
  k::embedding_backward(rdwte.data(), dout.data(), tokens.data(), N, C);
  expect_near("embedding_backward", dwte.data(), rdwte, dwte.size(), 0, 0);
  expect_guards("embedding_forward", out);
  expect_guards("embedding_backward", dwte);
}

// ---- RMSNorm --------------------------------------------------------------------------------------

TEST(CudaBodiesOnHost, Rmsnorm) {
  const int N = 6, C = 45;
  const size_t n = static_cast<size_t>(N) * C;
  auto x = randn(n, 10), w = randn(C, 11), dy = randn(n, 12), dx0 = randn(n, 13), dw0 = randn(C, 14);
  for (int lanes : kLaneCounts) {
    Guarded<float> out(n), rstd(N), dx(dx0), dw(dw0);
    std::vector<float> ref(n), rrstd(N), rdx = dx0, rdw = dw0;
    host_for_rows(RmsnormForwardBody{out.data(), rstd.data(), x.data(), w.data(), C, 1e-5f}, N, lanes);
    k::rmsnorm_forward(ref.data(), rrstd.data(), x.data(), w.data(), N, C, 1e-5f);
    expect_near("rmsnorm_forward", out.data(), ref, n, 1e-6, 1e-5);
    expect_near("rmsnorm_forward.rstd", rstd.data(), rrstd, N, 1e-6, 1e-5);
    host_for_rows(RmsnormBackwardBody{dx.data(), dy.data(), x.data(), w.data(), rrstd.data(), C}, N, lanes);
    host_for_each(RmsnormDweightBody{dw.data(), dy.data(), x.data(), rrstd.data(), N, C}, static_cast<size_t>(C));
    k::rmsnorm_backward(rdx.data(), rdw.data(), dy.data(), x.data(), w.data(), rrstd.data(), N, C);
    expect_near("rmsnorm_backward.dinp", dx.data(), rdx, n, 1e-5, 1e-5);
    expect_near("rmsnorm_backward.dweight", dw.data(), rdw, C, 0, 0);
    for (auto* g : {&out, &rstd, &dx, &dw}) expect_guards("rmsnorm", *g);
  }
}

// ---- RoPE -----------------------------------------------------------------------------------------

TEST(CudaBodiesOnHost, Rope) {
  const int N = 5, NH = 3, HD = 8, half = HD / 2;
  std::vector<int32_t> pos = {0, 1, 7, 300, 2};
  std::vector<float> inv_freq = {1.0f, 0.5f, 0.25f, 0.01f};
  Guarded<float> cs(static_cast<size_t>(N) * half), sn(static_cast<size_t>(N) * half);
  std::vector<float> rcs(cs.size()), rsn(sn.size());
  host_for_each(RopeCosSinBody{cs.data(), sn.data(), pos.data(), nullptr, HD, 10000.0f}, cs.size());
  k::rope_cos_sin(rcs.data(), rsn.data(), pos.data(), N, HD, 10000.0f);
  expect_near("rope_cos_sin.cos", cs.data(), rcs, cs.size(), 0, 0);
  expect_near("rope_cos_sin.sin", sn.data(), rsn, sn.size(), 0, 0);
  host_for_each(RopeCosSinBody{cs.data(), sn.data(), pos.data(), inv_freq.data(), HD, 0.0f}, cs.size());
  k::rope_cos_sin_inv_freq(rcs.data(), rsn.data(), pos.data(), inv_freq.data(), N, HD);
  expect_near("rope_cos_sin_inv_freq.cos", cs.data(), rcs, cs.size(), 0, 0);
  expect_guards("rope cos", cs);
  expect_guards("rope sin", sn);
  const size_t n = static_cast<size_t>(N) * NH * HD;
  auto x = randn(n, 15);
  for (float sign : {1.0f, -1.0f}) {
    Guarded<float> out(n);
    std::vector<float> ref(n);
    host_for_each(RopeRotateBody{out.data(), x.data(), rcs.data(), rsn.data(), sign, NH, HD},
                  static_cast<size_t>(N) * NH * half);
    if (sign > 0) k::rope_forward(ref.data(), x.data(), rcs.data(), rsn.data(), N, NH, HD);
    else k::rope_backward(ref.data(), x.data(), rcs.data(), rsn.data(), N, NH, HD);
    expect_near(sign > 0 ? "rope_forward" : "rope_backward", out.data(), ref, n, 0, 0);
    expect_guards("rope", out);
  }
}

// ---- log-prob, whole rows and chunked ---------------------------------------------------------------

TEST(CudaBodiesOnHost, Logprob) {
  const int N = 5, V = 70;
  auto logits = randn(static_cast<size_t>(N) * V, 16, 3.0f);
  logits[static_cast<size_t>(1) * V + 4] = -std::numeric_limits<float>::infinity();  // a masked-out token
  logits[static_cast<size_t>(4) * V + 9] = std::numeric_limits<float>::quiet_NaN();  // NaN parity: row 4
  std::vector<int32_t> targets = {3, 4, -1, 69, 0};
  auto dlogp = randn(N, 17), dent = randn(N, 18);
  for (int lanes : kLaneCounts) {
    Guarded<float> lp(N), ent(N), lse(N), dz(logits.size());
    std::vector<float> rlp(N), rent(N), rlse(N), rdz(logits.size());
    host_for_rows(LogprobForwardBody{lp.data(), ent.data(), lse.data(), logits.data(), targets.data(), 1 / 0.7f, V},
                  N, lanes);
    k::logprob_forward(rlp.data(), rent.data(), rlse.data(), logits.data(), targets.data(), 0.7f, N, V);
    expect_near("logprob_forward.logp", lp.data(), rlp, N, 1e-5, 1e-5);
    expect_near("logprob_forward.entropy", ent.data(), rent, N, 1e-5, 1e-5);
    expect_near("logprob_forward.lse", lse.data(), rlse, N, 1e-5, 1e-5);
    host_for_rows(LogprobBackwardBody{dz.data(), dlogp.data(), dent.data(), logits.data(), rlse.data(),
                                      targets.data(), 1 / 0.7f, V},
                  N, lanes);
    k::logprob_backward(rdz.data(), dlogp.data(), dent.data(), logits.data(), rlse.data(), targets.data(), 0.7f, N,
                        V);
    expect_near("logprob_backward", dz.data(), rdz, dz.size(), 1e-6, 1e-4);
    for (auto* g : {&lp, &ent, &lse, &dz}) expect_guards("logprob", *g);
  }
}

TEST(CudaBodiesOnHost, ChunkedLogprob) {
  const int N = 6, C = 12, V = 53;
  auto h = randn(static_cast<size_t>(N) * C, 19), W = randn(static_cast<size_t>(V) * C, 20);
  std::vector<int32_t> targets = {0, 52, 17, -1, 31, 16};
  auto dlogp = randn(N, 21), dent = randn(N, 22);
  for (int chunk : {0, 16, 53, 7}) {
    HostExec ex;
    Guarded<float> lp(N), ent(N), lse(N), scratch(k::chunked_logprob_scratch_floats(N, V, chunk)), sum(N);
    std::vector<float> rlp(N), rent(N), rlse(N), rscratch(scratch.size());
    chunked_logprob_forward_on(ex, lp.data(), ent.data(), lse.data(), h.data(), W.data(), targets.data(), 0.9f, N, C,
                               V, chunk, scratch.data(), sum.data());
    k::chunked_logprob_forward(rlp.data(), rent.data(), rlse.data(), h.data(), W.data(), targets.data(), 0.9f, N, C,
                               V, chunk, rscratch.data());
    expect_near("chunked_logprob_forward.logp", lp.data(), rlp, N, 1e-5, 1e-5);
    expect_near("chunked_logprob_forward.entropy", ent.data(), rent, N, 1e-5, 1e-5);
    expect_near("chunked_logprob_forward.lse", lse.data(), rlse, N, 1e-5, 1e-5);
    auto dh0 = randn(static_cast<size_t>(N) * C, 23), dW0 = randn(W.size(), 24);
    Guarded<float> dh(dh0), dW(dW0);
    std::vector<float> rdh = dh0, rdW = dW0;
    chunked_logprob_backward_on(ex, dh.data(), dW.data(), dlogp.data(), dent.data(), h.data(), W.data(), rlse.data(),
                                rent.data(), targets.data(), 0.9f, N, C, V, chunk, scratch.data());
    k::chunked_logprob_backward(rdh.data(), rdW.data(), dlogp.data(), dent.data(), h.data(), W.data(), rlse.data(),
                                rent.data(), targets.data(), 0.9f, N, C, V, chunk, rscratch.data());
    expect_near("chunked_logprob_backward.dh", dh.data(), rdh, rdh.size(), 1e-5, 1e-4);
    expect_near("chunked_logprob_backward.dW", dW.data(), rdW, rdW.size(), 1e-5, 1e-4);
    for (auto* g : {&lp, &ent, &lse, &scratch, &sum, &dh, &dW}) expect_guards("chunked_logprob", *g);
  }
}

// ---- fused GRPO loss ------------------------------------------------------------------------------

TEST(CudaBodiesOnHost, GrpoLoss) {
  const std::vector<int32_t> cu = {0, 4, 4, 9, 15};
  const int S = 4, T = 15;
  auto logp = randn(T, 25, 0.5f), old = randn(T, 26, 0.5f), ref = randn(T, 27, 0.5f), ent = randn(T, 28);
  std::vector<float> mask(T, 1.0f), adv = {1.0f, -0.5f, -2.0f, 0.7f}, iw(T, 1.0f);
  mask[2] = mask[10] = 0.0f;
  for (int i = 0; i < T; ++i) iw[static_cast<size_t>(i)] = 0.5f + 0.1f * static_cast<float>(i % 4);
  for (int variant = 0; variant < 4; ++variant) {
    GrpoLossParams p;
    p.kl_coef = 0.1f;
    p.entropy_coef = 0.01f;
    p.kl_type = variant == 1 ? KlEstimator::k1 : (variant == 2 ? KlEstimator::k2 : KlEstimator::k3);
    p.dual_clip = variant == 3 ? 3.0f : 0.0f;
    p.sequence_level_ratio = variant == 2;
    p.two_sided_clip = variant == 1 ? 2.0f : 0.0f;
    p.log_ratio_clamp = variant == 3 ? 0.3f : 0.0f;
    GrpoLossAggregation agg{2.0, variant % 2 == 0};
    GrpoLossBatch b;
    b.T = T, b.S = S, b.cu_seqlens = cu.data(), b.mask = mask.data(), b.advantages = adv.data();
    b.logp = logp.data(), b.logp_old = variant == 0 ? nullptr : old.data(), b.logp_ref = ref.data();
    b.is_weight = variant == 3 ? iw.data() : nullptr, b.entropy = ent.data();
    Guarded<float> dl(T), de(T);
    Guarded<double> sums(static_cast<size_t>(S) * kGrpoSums);
    std::vector<float> rdl(T), rde(T);
    host_for_each(GrpoSequenceBody{dl.data(), de.data(), sums.data(), b, p, agg}, static_cast<size_t>(S));
    const GrpoLossSums got = grpo_add_sums(sums.data(), S);
    const GrpoLossSums want = k::grpo_loss(rdl.data(), rde.data(), b, p, agg);
    expect_near("grpo_loss.dlogp", dl.data(), rdl, T, 0, 0);
    expect_near("grpo_loss.dentropy", de.data(), rde, T, 0, 0);
    const double g[] = {got.loss, got.pg_loss, got.kl_loss, got.tokens, got.kl_sum, got.clip_low_sum,
                        got.clip_high_sum, got.dual_clip_sum, got.entropy_sum, got.ratio_sum, got.is_weight_sum};
    const double w[] = {want.loss, want.pg_loss, want.kl_loss, want.tokens, want.kl_sum, want.clip_low_sum,
                        want.clip_high_sum, want.dual_clip_sum, want.entropy_sum, want.ratio_sum, want.is_weight_sum};
    expect_near("grpo_loss.sums", g, w, kGrpoSums, 1e-12, 1e-12);
    expect_guards("grpo dlogp", dl);
    expect_guards("grpo dentropy", de);
    expect_guards("grpo sums", sums);
  }
}

// ---- attention ------------------------------------------------------------------------------------

TEST(CudaBodiesOnHost, PackedAttention) {
  const std::vector<int32_t> cu = {0, 5, 5, 6, 14};  // an empty and a one-token sequence
  const int S = 4, N = 14, NH = 4, NKV = 2, HD = 6, L = 8;
  const size_t nq = static_cast<size_t>(N) * NH * HD, nk = static_cast<size_t>(N) * NKV * HD;
  auto q = randn(nq, 29), kk = randn(nk, 30), v = randn(nk, 31), dout = randn(nq, 32);
  std::vector<float> scratch(k::attention_scratch_floats(L, 1));
  std::vector<float> rout(nq), rlse(static_cast<size_t>(N) * NH), rdq(nq), rdk(nk), rdv(nk);
  k::attention_forward(rout.data(), rlse.data(), scratch.data(), scratch.size(), q.data(), kk.data(), v.data(),
                       cu.data(), S, L, N, NH, NKV, HD);
  k::attention_backward(rdq.data(), rdk.data(), rdv.data(), scratch.data(), scratch.size(), dout.data(), q.data(),
                        kk.data(), v.data(), rout.data(), rlse.data(), cu.data(), S, L, N, NH, NKV, HD);
  // The FlashAttention-2 tile bodies (flash_attention.h; kernels.cuda_flash_attention has more cases).
  for (int lanes : kLaneCounts) {
    const FlashShape sh{cu.data(), S, N, NH, NKV, HD, 4};
    Guarded<float> out(nq), lse(static_cast<size_t>(N) * NH), dq(nq), dk(nk), dv(nk);
    host_for_blocks(FlashForwardBody{out.data(), lse.data(), q.data(), kk.data(), v.data(), sh}, lanes,
                    flash_forward_floats(sh.tile, HD) * sizeof(float));
    expect_near("attention_forward", out.data(), rout, nq, 1e-5, 1e-4);
    expect_near("attention_forward.lse", lse.data(), rlse, lse.size(), 1e-5, 1e-5);
    const AttnGrads in{dout.data(), q.data(), kk.data(), v.data(), rout.data(), rlse.data()};
    const size_t bytes = flash_backward_floats(sh.tile, HD) * sizeof(float);
    host_for_blocks(FlashBackwardDkDvBody{dk.data(), dv.data(), in, sh}, lanes, bytes);
    host_for_blocks(FlashBackwardDqBody{dq.data(), in, sh}, lanes, bytes);
    expect_near("attention_backward.dq", dq.data(), rdq, nq, 1e-5, 1e-4);
    expect_near("attention_backward.dk", dk.data(), rdk, nk, 1e-5, 1e-4);
    expect_near("attention_backward.dv", dv.data(), rdv, nk, 1e-5, 1e-4);
    for (auto* g : {&out, &lse, &dq, &dk, &dv}) expect_guards("attention", *g);
  }
}

TEST(CudaBodiesOnHost, DecodeAttentionAndKvWrite) {
  const int slots = 3, cache_len = 10, NH = 4, NKV = 2, HD = 5, KD = NKV * HD, T = 4;
  const size_t nc = static_cast<size_t>(slots) * cache_len * KD;
  Guarded<float> kc(randn(nc, 33)), vc(randn(nc, 34));
  std::vector<float> rkc = kc.vec(), rvc = vc.vec();
  auto k_new = randn(static_cast<size_t>(T) * KD, 35), v_new = randn(static_cast<size_t>(T) * KD, 36);
  std::vector<int32_t> slot = {2, 0, 0, 1}, pos = {9, 3, 4, 0};
  host_for_each(KvWriteBody{kc.data(), vc.data(), k_new.data(), v_new.data(), slot.data(), pos.data(), cache_len, KD},
                static_cast<size_t>(T) * KD);
  k::kv_cache_write(rkc.data(), rvc.data(), k_new.data(), v_new.data(), slot.data(), pos.data(), T, cache_len, KD);
  expect_near("kv_cache_write.k", kc.data(), rkc, nc, 0, 0);
  expect_near("kv_cache_write.v", vc.data(), rvc, nc, 0, 0);
  expect_guards("kv k", kc);
  expect_guards("kv v", vc);
  const int B = 3;
  auto q = randn(static_cast<size_t>(B) * NH * HD, 37);
  std::vector<int32_t> kv_len = {10, 0, 5}, bslot = {1, 2, 0};
  for (const int32_t* sl : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(bslot.data())}) {
    Guarded<float> out(static_cast<size_t>(B) * NH * HD);
    std::vector<float> ref(out.size());
    host_for_each(AttnDecodeBody{out.data(), q.data(), rkc.data(), rvc.data(), kv_len.data(), sl, cache_len, NH, NKV, HD},
                  static_cast<size_t>(B) * NH);
    k::attention_decode_forward(ref.data(), q.data(), rkc.data(), rvc.data(), kv_len.data(), sl, B, cache_len, NH, NKV,
                                HD);
    expect_near("attention_decode_forward", out.data(), ref, out.size(), 1e-6, 1e-5);
    expect_guards("decode", out);
  }
}

// ---- MoE routing, dispatch and the whole layer ----------------------------------------------------

struct MoeCase {
  MoeConfig cfg;
  int N;
};

TEST(CudaBodiesOnHost, MoeLayerAndDispatch) {
  for (const MoeCase& mc : {MoeCase{{8, 6, 4, 2, true, 0, true}, 9}, MoeCase{{8, 5, 5, 1, false, 3, true}, 7},
                            MoeCase{{6, 4, 3, 3, true, 2, true}, 4}}) {
    const MoeConfig& c = mc.cfg;
    const int N = mc.N, C = c.C, H = c.H, E = c.E, Hs = c.H_shared;
    auto wr = randn(static_cast<size_t>(E) * C, 40), wg = randn(static_cast<size_t>(E) * H * C, 41, 0.3f),
         wu = randn(static_cast<size_t>(E) * H * C, 42, 0.3f), wd = randn(static_cast<size_t>(E) * C * H, 43, 0.3f),
         sg = randn(static_cast<size_t>(Hs) * C, 44, 0.3f), su = randn(static_cast<size_t>(Hs) * C, 45, 0.3f),
         sd = randn(static_cast<size_t>(C) * Hs, 46, 0.3f), x = randn(static_cast<size_t>(N) * C, 47),
         dout = randn(static_cast<size_t>(N) * C, 48);
    MoeWeights w{wr.data(), wg.data(), wu.data(), wd.data(), Hs ? sg.data() : nullptr, Hs ? su.data() : nullptr,
                 Hs ? sd.data() : nullptr, {}};
    // CPU op
    std::vector<float> rout(x.size()), rsaved(k::moe_saved_floats(c, N)), rscratch(k::moe_scratch_floats(c, N));
    MoeStats rstats;
    k::moe_forward(rout.data(), rsaved.data(), &rstats, x.data(), w, c, N, rscratch.data());
    std::vector<float> rdx(x.size()), gwr(wr.size()), gwg(wg.size()), gwu(wu.size()), gwd(wd.size()), gsg(sg.size()),
        gsu(su.size()), gsd(sd.size());
    MoeGrads rg{gwr.data(), gwg.data(), gwu.data(), gwd.data(), gsg.data(), gsu.data(), gsd.data(), {}};
    k::moe_backward(rdx.data(), rg, dout.data(), 0.3f, x.data(), rsaved.data(), w, c, N, rscratch.data());
    // The launch sequence on the host
    HostExec ex;
    const MoeSavedLayout SL = moe_saved_layout(c, N);
    ASSERT_EQ(SL.total, rsaved.size());
    Guarded<float> out(x.size()), saved(SL.total),
        scratch(moe_scratch_layout(c, N, ex.plan_tmp_bytes(N * c.K, E)).total), dx(x.size());
    MoeStats stats;
    moe_layer_forward(ex, out.data(), saved.data(), &stats, x.data(), w, c, N, scratch.data());
    expect_near("moe_forward", out.data(), rout, rout.size(), 1e-5, 1e-4);
    expect_near("moe_forward.probs", saved.data() + SL.probs, rsaved.data() + SL.probs, static_cast<size_t>(N) * E,
                1e-6, 1e-5);
    const MoeRouting got = k::moe_saved_routing(saved.data(), c, N), want = k::moe_saved_routing(rsaved.data(), c, N);
    const size_t NK = static_cast<size_t>(N) * c.K;
    EXPECT_TRUE(std::equal(got.experts, got.experts + NK, want.experts)) << "top-k experts";
    EXPECT_TRUE(std::equal(got.offsets, got.offsets + E + 1, want.offsets)) << "expert histogram + scan";
    EXPECT_TRUE(std::equal(got.row_slot, got.row_slot + NK, want.row_slot)) << "stable sort by expert";
    EXPECT_TRUE(std::equal(got.slot_row, got.slot_row + NK, want.slot_row)) << "inverse rows";
    expect_near("moe_forward.weights", got.weights, want.weights, NK, 1e-6, 1e-5);
    EXPECT_NEAR(stats.aux_loss, rstats.aux_loss, 1e-5);
    EXPECT_EQ(stats.max_expert_load, rstats.max_expert_load);
    EXPECT_EQ(stats.empty_experts, rstats.empty_experts);
    Guarded<float> hwr(wr.size()), hwg(wg.size()), hwu(wu.size()), hwd(wd.size()), hsg(sg.size()), hsu(su.size()),
        hsd(sd.size());
    MoeGrads hg{hwr.data(), hwg.data(), hwu.data(), hwd.data(), hsg.data(), hsu.data(), hsd.data(), {}};
    moe_layer_backward(ex, dx.data(), hg, dout.data(), 0.3f, x.data(), saved.data(), w, c, N, scratch.data());
    expect_near("moe_backward.dinp", dx.data(), rdx, rdx.size(), 1e-5, 1e-4);
    expect_near("moe_backward.w_router", hwr.data(), gwr, gwr.size(), 1e-5, 1e-4);
    expect_near("moe_backward.w_gate", hwg.data(), gwg, gwg.size(), 1e-5, 1e-4);
    expect_near("moe_backward.w_up", hwu.data(), gwu, gwu.size(), 1e-5, 1e-4);
    expect_near("moe_backward.w_down", hwd.data(), gwd, gwd.size(), 1e-5, 1e-4);
    expect_near("moe_backward.ws_gate", hsg.data(), gsg, gsg.size(), 1e-5, 1e-4);
    expect_near("moe_backward.ws_down", hsd.data(), gsd, gsd.size(), 1e-5, 1e-4);
    for (auto* g : {&out, &saved, &scratch, &dx, &hwr, &hwg, &hwu, &hwd, &hsg, &hsu, &hsd}) expect_guards("moe", *g);

    // Dispatcher round trip: combine with weights == moe_unpermute, unweighted back == K * x.
    Guarded<float> o(x.size()), back(x.size()), xp(NK * C);
    Guarded<int32_t> off(static_cast<size_t>(E) + 1), rs(NK), sr(NK);
    std::vector<int32_t> plan_tmp(static_cast<size_t>(E));
    moe_dispatch_round_trip(ex, o.data(), back.data(), off.data(), rs.data(), sr.data(), want.experts, want.weights,
                            x.data(), N, c.K, E, C, xp.data(), plan_tmp.data());
    std::vector<float> ro(x.size()), rxp(NK * C), rback(x.size());
    k::moe_permute(rxp.data(), x.data(), want.slot_row, N, c.K, C);
    k::moe_unpermute(ro.data(), rxp.data(), want.weights, want.slot_row, N, c.K, C, false);
    for (size_t i = 0; i < x.size(); ++i) rback[i] = x[i] * static_cast<float>(c.K);
    expect_near("moe_permute", xp.data(), rxp, rxp.size(), 0, 0);
    expect_near("moe_unpermute", o.data(), ro, ro.size(), 1e-6, 1e-6);
    expect_near("moe_round_trip", back.data(), rback, rback.size(), 1e-6, 1e-6);
    for (auto* g : {&o, &back, &xp}) expect_guards("dispatch", *g);
    for (auto* g : {&off, &rs, &sr}) expect_guards("dispatch plan", *g);
  }
}

// ---- random ops -----------------------------------------------------------------------------------

TEST(CudaBodiesOnHost, FillNormal) {
  for (size_t n : {size_t(1), size_t(10), size_t(33)}) {
    uint64_t s0 = 12345, rs = s0;
    Guarded<float> x(n);
    std::vector<float> ref(n);
    host_for_each(FillNormalBody{x.data(), n, 0.02, s0}, (n + 1) / 2);
    k::fill_normal(ref.data(), n, 0.02, &rs);
    expect_near("fill_normal", x.data(), ref, n, 0, 0);
    EXPECT_EQ(rs, s0 + 2 * ((n + 1) / 2) * kSplitmixGamma) << "the state the launcher leaves";
    expect_guards("fill_normal", x);
  }
}

// The sampling launch sequence on the host: stats row, std::stable_sort standing in for CUB's
// stable descending radix sort, the finishing thread.
int32_t host_sample(float* logprob, const std::vector<float>& logits, const SampleParams& sp, uint64_t* rng, int lanes) {
  const int V = static_cast<int>(logits.size());
  const bool greedy = sp.temperature <= 0.0f;
  const double inv_t = greedy ? 1.0 : 1.0 / sp.temperature;
  Guarded<double> stats(2), prob(static_cast<size_t>(V));
  Guarded<int32_t> arg(1), order(static_cast<size_t>(V)), tok(1);
  host_for_rows(SampleStatsBody{stats.data(), arg.data(), prob.data(), order.data(), logits.data(), inv_t, V}, 1, lanes);
  const bool truncate = (sp.top_k > 0 && sp.top_k < V) || sp.top_p < 1.0f;
  std::vector<int32_t> sorted = order.vec();
  if (truncate)
    std::stable_sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
  const double u01 = greedy ? 0.0 : uniform01(*rng);
  Guarded<float> lp(1);
  host_for_each(SampleFinishBody{tok.data(), lp.data(), stats.data(), arg.data(), prob.data(),
                                 truncate ? sorted.data() : nullptr, logits.data(), inv_t, u01, V, sp.top_k, sp.top_p,
                                 greedy},
                1);
  EXPECT_TRUE(stats.guards_intact() && prob.guards_intact() && arg.guards_intact() && order.guards_intact() &&
              tok.guards_intact() && lp.guards_intact());
  *logprob = lp[0];
  return tok[0];
}

TEST(CudaBodiesOnHost, SampleToken) {
  const int V = 41;
  auto logits = randn(V, 50, 2.0f);
  logits[7] = logits[8] = 4.0f;  // a tie at the top
  const SampleParams cases[] = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.7f, 5, 1.0f}, {1.3f, 0, 0.8f}, {1.0f, 3, 0.5f}};
  for (const SampleParams& sp : cases)
    for (int lanes : kLaneCounts)
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        uint64_t r1 = seed, r2 = seed;
        float lp1 = 0, lp2 = 0;
        std::vector<unsigned char> scratch(k::sample_scratch_bytes(V) + 8);
        const int32_t want = k::sample_token(&lp1, logits.data(), V, sp, &r1, scratch.data());
        const int32_t got = host_sample(&lp2, logits, sp, &r2, lanes);
        EXPECT_EQ(got, want) << "temperature " << sp.temperature << " top_k " << sp.top_k << " top_p " << sp.top_p;
        EXPECT_NEAR(lp2, lp1, 1e-5);
        EXPECT_EQ(r1, r2);
      }
}

}  // namespace
}  // namespace troupe::kernels::cuda
