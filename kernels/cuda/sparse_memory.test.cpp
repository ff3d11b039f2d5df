// kernels.cuda_host_decisions (sparse buffers): SparseMemory's bookkeeping over a fake driver --
// granules mapped where asked and once only, given back to the pool and reused, the peak, whole
// granules required, out of memory named, and nothing left mapped or created once freed and trimmed.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "sparse_memory.h"

namespace troupe::kernels::cuda {
namespace {

// A driver over a counter: what is created, mapped where, reserved.
struct FakeDriver {
  size_t g = 4096;
  uint64_t next = 0;
  size_t limit = 1000;  // granules that create() may make
  std::set<uint64_t> live;                // created, not released
  std::map<uintptr_t, uint64_t> mapped;   // address -> handle
  std::map<uintptr_t, size_t> reserved;
  uintptr_t next_at = 1 << 20;
  SparseMemory::Driver driver() {
    SparseMemory::Driver d;
    d.granularity = g;
    d.reserve = [this](size_t bytes) {
      const uintptr_t at = next_at;
      next_at += bytes + g;
      reserved[at] = bytes;
      return at;
    };
    d.free_range = [this](uintptr_t at, size_t) { reserved.erase(at); };
    d.create = [this]() -> uint64_t {
      if (live.size() >= limit) return 0;
      live.insert(++next);
      return next;
    };
    d.release = [this](uint64_t h) { live.erase(h); };
    d.map = [this](uintptr_t at, uint64_t h) -> std::string {
      if (mapped.count(at)) return "mapped twice";
      mapped[at] = h;
      return {};
    };
    d.unmap = [this](uintptr_t at) { mapped.erase(at); };
    return d;
  }
};

TEST(CudaSparseMemory, MapsWholeGranulesOnceAndReusesThePool) {
  FakeDriver f;
  {
    SparseMemory s(f.driver());
    void* p = s.reserve(10 * 4096 + 100);  // 11 granules, the last one partly used
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(s.owns(p));
    ASSERT_TRUE(s.map(p, 0, 2 * 4096).ok());
    ASSERT_TRUE(s.map(p, 4096, 3 * 4096).ok());  // granule 1 again: mapped once
    EXPECT_EQ(f.mapped.size(), 4u);
    EXPECT_EQ(s.mapped_bytes(), 4u * 4096);
    ASSERT_TRUE(s.map(p, 10 * 4096, 100).ok());  // the buffer's end may close the last granule
    const auto r = s.mapped_ranges(p);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0], (std::pair<size_t, size_t>{0, 4 * 4096}));
    EXPECT_EQ(r[1], (std::pair<size_t, size_t>{10 * 4096, 10 * 4096 + 100}));
    ASSERT_TRUE(s.unmap(p, 0, 4 * 4096).ok());
    EXPECT_EQ(s.mapped_bytes(), 4096u);
    EXPECT_EQ(s.pooled_bytes(), 4u * 4096);
    EXPECT_EQ(s.peak_bytes(), 5u * 4096);
    ASSERT_TRUE(s.map(p, 5 * 4096, 4 * 4096).ok());  // the pool's granules, nothing new created
    EXPECT_EQ(f.live.size(), 5u);
    EXPECT_EQ(s.pooled_bytes(), 0u);
    s.reset_peak();
    EXPECT_EQ(s.peak_bytes(), 5u * 4096);
    // Not whole granules, past the end, not a sparse buffer: refused, nothing changes.
    EXPECT_FALSE(s.map(p, 100, 4096).ok());
    EXPECT_FALSE(s.map(p, 0, 100).ok());
    EXPECT_FALSE(s.map(p, 10 * 4096, 4096).ok());
    int other = 0;
    EXPECT_FALSE(s.map(&other, 0, 4096).ok());
    EXPECT_EQ(f.mapped.size(), 5u);
    s.free(p);  // unmaps what is mapped, frees the addresses
    EXPECT_TRUE(f.mapped.empty());
    EXPECT_TRUE(f.reserved.empty());
    EXPECT_EQ(s.pooled_bytes(), 5u * 4096);
  }
  EXPECT_TRUE(f.live.empty());  // the pool released with it
}

TEST(CudaSparseMemory, OutOfMemoryIsNamedAndKeepsWhatWasMapped) {
  FakeDriver f;
  f.limit = 3;
  SparseMemory s(f.driver());
  void* p = s.reserve(8 * 4096);
  const Status st = s.map(p, 0, 8 * 4096);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("out of device memory mapping 32768 bytes"), std::string::npos) << st.error().message;
  EXPECT_EQ(s.mapped_bytes(), 3u * 4096);
  s.trim();  // nothing pooled: the mapped granules stay
  EXPECT_EQ(f.live.size(), 3u);
  ASSERT_TRUE(s.unmap(p, 0, 8 * 4096).ok());
  s.trim();
  EXPECT_TRUE(f.live.empty());
}

TEST(CudaSparseMemory, NoVirtualMemoryManagementMeansNoSparseBuffers) {
  SparseMemory s(SparseMemory::Driver{});
  EXPECT_EQ(s.granularity(), 0u);
  EXPECT_EQ(s.reserve(4096), nullptr);
}

}  // namespace
}  // namespace troupe::kernels::cuda
