// kernels.backend: the backend seam on the CPU backend -- device selection, buffers and copies,
// and the ops the table adds to ops.h (residual add, KV-cache write, packed layout, sampling, the
// fused GRPO loss, whose gradient is checked against central finite differences), the out-of-memory
// error's wording and what policy.compute_dtype auto means on each kind of backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/compute_dtype.h"
#include "troupe/kernels/device.h"

namespace k = troupe::kernels;

TEST(Backend, DeviceSelection) {
  auto cpu = k::backend_for("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ((*cpu)->name(), "cpu");
  EXPECT_TRUE((*cpu)->host_visible());
  EXPECT_EQ(*cpu, &k::cpu_backend());
  auto cuda = k::backend_for("cuda");
  if (k::cuda_device_count() == 0) {  // no GPU (or no CUDA in this build): a clear error, never the CPU
    ASSERT_FALSE(cuda.ok());
    EXPECT_TRUE(cuda.error().message.find("no usable CUDA device") != std::string::npos ||
                cuda.error().message.find("has no CUDA") != std::string::npos)
        << cuda.error().message;
  } else {
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    EXPECT_EQ((*cuda)->name(), "cuda");
    EXPECT_FALSE((*cuda)->host_visible());
  }
  EXPECT_FALSE(k::backend_for("tpu").ok());
}

TEST(Backend, BuffersAreZeroedGrowAndCopy) {
  const k::Backend& be = k::cpu_backend();
  auto a = be.alloc(16 * sizeof(float));
  ASSERT_TRUE(a.ok());
  for (size_t i = 0; i < a->num_floats(); ++i) EXPECT_EQ(a->floats()[i], 0.0f);
  std::vector<float> host(16);
  for (int i = 0; i < 16; ++i) host[i] = static_cast<float>(i);
  be.copy_host_to_device(a->data(), host.data(), sizeof(float) * 16);
  k::Buffer buf = std::move(*a);
  ASSERT_TRUE(be.grow(buf, 32 * sizeof(float)).ok());
  ASSERT_EQ(buf.num_floats(), 32u);
  std::vector<float> back(32, -1.0f);
  be.copy_device_to_host(back.data(), buf.data(), buf.bytes());
  be.synchronize();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(back[i], static_cast<float>(i));
  for (int i = 16; i < 32; ++i) EXPECT_EQ(back[i], 0.0f);
  const void* before = buf.data();
  ASSERT_TRUE(be.grow(buf, 8 * sizeof(float)).ok());  // large enough: kept
  EXPECT_EQ(buf.data(), before);
}

#if defined(__SANITIZE_ADDRESS__)
#define TROUPE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TROUPE_TEST_ASAN 1
#endif
#endif
TEST(Backend, OutOfMemoryNamesTheTensorAndLeavesTheBackendUsable) {
#ifdef TROUPE_TEST_ASAN
  GTEST_SKIP() << "an impossible allocation aborts under AddressSanitizer";
#else
  const k::Backend& be = k::cpu_backend();
  const size_t huge = size_t(1) << 62;
  auto a = be.alloc(huge, "the weights (4611686018427387904 bytes)");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("cpu backend: out of memory allocating the weights"), std::string::npos)
      << a.error().message;
  EXPECT_NE(a.error().message.find("(" + std::to_string(huge) + " bytes)"), std::string::npos);
  EXPECT_NE(be.alloc(huge).error().message.find("allocating a buffer ("), std::string::npos);
  k::Buffer buf;
  EXPECT_FALSE(be.grow(buf, huge, "the activation arena").ok());
  EXPECT_TRUE(be.alloc(64).ok());  // still usable
#endif
}

TEST(Backend, ComputeDtypeAutoIsBf16OnlyWhereTheBackendHasBf16Gemms) {
  using D = k::ComputeDtype;
  EXPECT_FALSE(k::cpu_backend().supports_bf16_compute());
  EXPECT_EQ(k::resolve_compute_dtype(D::auto_, k::cpu_backend().supports_bf16_compute(), false), D::fp32);
  EXPECT_EQ(k::resolve_compute_dtype(D::auto_, true, false), D::bf16);  // cuda
  EXPECT_EQ(k::resolve_compute_dtype(D::auto_, true, true), D::fp32);   // batch-invariant: exact GEMMs
  EXPECT_EQ(k::resolve_compute_dtype(D::fp32, true, false), D::fp32);
  EXPECT_EQ(k::resolve_compute_dtype(D::bf16, false, false), D::bf16);  // (the model refuses it there)
  {
    const k::ComputeDtypeScope scope(D::auto_, true);  // auto in a scope counts as fp32
    EXPECT_EQ(k::compute_dtype(), D::fp32);
    EXPECT_TRUE(k::allow_tf32());
  }
  EXPECT_EQ(k::compute_dtype(), D::fp32);
  EXPECT_FALSE(k::allow_tf32());
}

TEST(Backend, AddKvCacheWriteAndPackedLayout) {
  const k::Backend& be = k::cpu_backend();
  std::vector<float> a{1, 2, 3}, b{10, 20, 30};
  be.add(a.data(), a.data(), b.data(), 3);  // in place
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33}));

  const int KD = 2, cache_len = 3;
  std::vector<float> kc(2 * cache_len * KD, 0), vc(2 * cache_len * KD, 0);
  std::vector<float> kk{1, 2, 3, 4}, vv{5, 6, 7, 8};
  std::vector<int32_t> slot{1, 0}, pos{2, 0};
  be.kv_cache_write(kc.data(), vc.data(), kk.data(), vv.data(), slot.data(), pos.data(), 2, cache_len, KD);
  EXPECT_EQ(kc[(1 * cache_len + 2) * KD], 1);
  EXPECT_EQ(kc[(1 * cache_len + 2) * KD + 1], 2);
  EXPECT_EQ(vc[0], 7);
  EXPECT_EQ(vc[1], 8);

  std::vector<int32_t> cu{0, 2, 2, 5}, p(5), id(5), s0(5), s1(5);
  EXPECT_EQ(be.packed_seq_layout(p.data(), id.data(), s0.data(), s1.data(), cu.data(), 3), 3);
  EXPECT_EQ(p, (std::vector<int32_t>{0, 1, 0, 1, 2}));
  EXPECT_EQ(id, (std::vector<int32_t>{0, 0, 2, 2, 2}));
  EXPECT_EQ(s0, (std::vector<int32_t>{0, 0, 2, 2, 2}));
  EXPECT_EQ(s1, (std::vector<int32_t>{2, 2, 5, 5, 5}));
}

TEST(Backend, SampleTokenGreedyTopKAndSeed) {
  const k::Backend& be = k::cpu_backend();
  const int V = 5;
  std::vector<float> logits{0.1f, 2.0f, -1.0f, 1.5f, 0.0f};
  std::vector<char> scratch(be.sample_scratch_bytes(V) + 8);
  void* scr = scratch.data() + (8 - reinterpret_cast<uintptr_t>(scratch.data()) % 8) % 8;
  double s = 0;
  for (float z : logits) s += std::exp(z);
  uint64_t rng = 7;
  float lp = 0;
  k::SampleParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(be.sample_token(&lp, logits.data(), V, greedy, &rng, scr), 1);
  EXPECT_NEAR(lp, 2.0 - std::log(s), 1e-6);
  EXPECT_EQ(rng, 7u);  // greedy draws nothing
  k::SampleParams top1;
  top1.top_k = 1;
  EXPECT_EQ(be.sample_token(&lp, logits.data(), V, top1, &rng, scr), 1);
  k::SampleParams plain;
  uint64_t r1 = 42, r2 = 42;
  for (int i = 0; i < 20; ++i) {
    const int32_t a = be.sample_token(&lp, logits.data(), V, plain, &r1, scr);
    const int32_t b = be.sample_token(&lp, logits.data(), V, plain, &r2, scr);
    EXPECT_EQ(a, b);
    EXPECT_GE(a, 0);
    EXPECT_LT(a, V);
  }
}

namespace {
double grpo_loss_at(const std::vector<float>& logp, k::GrpoLossBatch b, const k::GrpoLossParams& p,
                    const k::GrpoLossAggregation& agg) {
  std::vector<float> d(logp.size()), de(logp.size());
  b.logp = logp.data();
  return k::cpu_backend().grpo_loss(d.data(), de.data(), b, p, agg).loss;
}
}  // namespace

// d loss / d logp of the fused loss against central differences, token and sequence level.
TEST(Backend, GrpoLossFiniteDifferenceGradient) {
  const int T = 7, S = 2;
  std::vector<int32_t> cu{0, 3, 7};
  std::vector<float> mask{0, 1, 1, 1, 1, 0, 1}, adv{0.7f, -0.4f};
  std::vector<float> logp{-1.0f, -0.9f, -2.1f, -0.5f, -1.3f, -0.2f, -0.8f};
  std::vector<float> old{-1.1f, -0.95f, -2.0f, -0.52f, -1.25f, -0.3f, -0.85f};
  std::vector<float> ref{-1.2f, -1.0f, -1.9f, -0.6f, -1.4f, -0.1f, -0.7f};
  std::vector<float> ent{1, 2, 3, 4, 5, 6, 7};
  for (bool seq : {false, true}) {
    k::GrpoLossParams p;
    p.clip_low = p.clip_high = 0.5f;  // away from the clip boundaries at these ratios
    p.kl_coef = 0.1f;
    p.entropy_coef = 0.01f;
    p.sequence_level_ratio = seq;
    const k::GrpoLossAggregation agg{3.0, true};
    k::GrpoLossBatch b;
    b.T = T;
    b.S = S;
    b.cu_seqlens = cu.data();
    b.mask = mask.data();
    b.advantages = adv.data();
    b.logp_old = old.data();
    b.logp_ref = ref.data();
    b.entropy = ent.data();
    std::vector<float> dlogp(T), dent(T);
    b.logp = logp.data();
    k::cpu_backend().grpo_loss(dlogp.data(), dent.data(), b, p, agg);
    for (int t = 0; t < T; ++t) {
      const float h = 1e-3f;
      std::vector<float> up = logp, dn = logp;
      up[t] += h;
      dn[t] -= h;
      const double fd = (grpo_loss_at(up, b, p, agg) - grpo_loss_at(dn, b, p, agg)) / (double(up[t]) - dn[t]);
      EXPECT_NEAR(dlogp[t], fd, 1e-4 + 1e-3 * std::fabs(fd)) << "t=" << t << " seq=" << seq;
      EXPECT_NEAR(dent[t], mask[t] != 0 ? -0.01 / (3.0 * (t < 3 ? 2.0 : 3.0)) : 0.0, 1e-8);
    }
  }
}
