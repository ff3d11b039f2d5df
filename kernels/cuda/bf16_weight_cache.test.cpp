// kernels.cuda_host_decisions (bf16 weight copies): an arena is converted once per write however
// many GEMMs read it, never served stale, operands outside or straddling an arena get no copy, and
// an allocation failure falls back (nullptr) and leaves the cache usable.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16_weight_cache.h"
#include "bodies/bf16.h"

namespace troupe::kernels::cuda {
namespace {

struct Fake {
  int allocs = 0, releases = 0, converts = 0;
  bool fail = false;
  std::vector<std::vector<uint16_t>> blocks;
  Bf16WeightCache::Memory memory() {
    return {[this](size_t n) -> uint16_t* {
              if (fail) return nullptr;
              ++allocs;
              blocks.emplace_back(n);
              return blocks.back().data();
            },
            [this](uint16_t*) { ++releases; },
            [this](uint16_t* dst, const float* src, size_t n) {
              ++converts;
              for (size_t i = 0; i < n; ++i) dst[i] = hd_bf16_bits(src[i]);
            }};
  }
};

TEST(CudaBf16WeightCache, ConvertsOncePerWriteNotPerGemm) {
  Fake f;
  f.blocks.reserve(8);
  std::vector<float> w(1000, 1.0f);
  Bf16WeightCache cache(f.memory());
  EXPECT_EQ(cache.lookup(w.data(), 10), nullptr);  // nothing registered: the GEMM packs
  cache.weights_written(w.data(), w.size());
  for (int step = 0; step < 3; ++step) {
    for (int gemm = 0; gemm < 50; ++gemm) {
      const uint16_t* c = cache.lookup(w.data() + 100 + gemm, 200);
      ASSERT_NE(c, nullptr);
      EXPECT_EQ(c[0], hd_bf16_bits(w[100 + static_cast<size_t>(gemm)]));
    }
    EXPECT_EQ(cache.conversions(w.data()), static_cast<uint64_t>(step + 1));
    w[150] = 3.0f + static_cast<float>(step);  // the optimizer step
    cache.weights_written(w.data(), w.size());
  }
  EXPECT_EQ(f.allocs, 1);
  const uint16_t* c = cache.lookup(w.data() + 150, 1);  // never stale after a write
  EXPECT_EQ(*c, hd_bf16_bits(5.0f));
}

TEST(CudaBf16WeightCache, OperandsOutsideOrStraddlingAnArenaGetNoCopy) {
  Fake f;
  f.blocks.reserve(8);
  std::vector<float> w(100), other(100);
  Bf16WeightCache cache(f.memory());
  cache.weights_written(w.data(), w.size());
  EXPECT_EQ(cache.lookup(other.data(), 10), nullptr);
  EXPECT_EQ(cache.lookup(w.data() + 95, 10), nullptr);  // runs past the arena
  EXPECT_NE(cache.lookup(w.data() + 90, 10), nullptr);  // ends exactly at its end
  EXPECT_EQ(f.converts, 1);
}

TEST(CudaBf16WeightCache, AllocationFailureFallsBackAndForgetReleases) {
  Fake f;
  f.blocks.reserve(8);
  std::vector<float> w(64, 0.5f);
  Bf16WeightCache cache(f.memory());
  cache.weights_written(w.data(), w.size());
  f.fail = true;
  EXPECT_EQ(cache.lookup(w.data(), 8), nullptr);
  f.fail = false;
  EXPECT_NE(cache.lookup(w.data(), 8), nullptr);  // usable again
  cache.weights_written(w.data(), 32);           // re-sized: the old copy goes
  EXPECT_EQ(f.releases, 1);
  EXPECT_EQ(cache.lookup(w.data() + 40, 1), nullptr);
  EXPECT_NE(cache.lookup(w.data() + 16, 16), nullptr);
  cache.forget(w.data());
  EXPECT_EQ(cache.arenas(), 0u);
  EXPECT_EQ(f.releases, 2);
  EXPECT_EQ(cache.lookup(w.data(), 1), nullptr);
}

}  // namespace
}  // namespace troupe::kernels::cuda
