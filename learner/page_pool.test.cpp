// PagePool and PooledRanges (page_pool.h), each fallback forced through PagePoolFaults: no memfd, a
// pool too small for a span, a mapping that fails, an unmap that fails (the span stays mapped), spans
// that are not page-aligned. The ZeRO-3 steps under the same faults: tests/learner/shard_page_pool.cpp.
#include "troupe/learner/page_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

using namespace troupe::learner;

namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A page-aligned anonymous buffer of `pages` pages, unmapped when it goes.
struct Buffer {
  explicit Buffer(size_t pages) : bytes(pages * kPage) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    at = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Buffer() {
    if (at) munmap(at, bytes);
  }
  char* page(size_t i) const { return at + i * kPage; }
  float* floats() const { return reinterpret_cast<float*>(at); }
  size_t bytes;
  char* at;
};

bool all_are(const char* p, size_t n, char v) {
  return std::all_of(p, p + n, [v](char c) { return c == v; });
}

class PagePoolTest : public ::testing::Test {
 protected:
  void SetUp() override { page_pool_faults() = {}; }
  void TearDown() override { page_pool_faults() = {}; }
};

TEST_F(PagePoolTest, MapsReusesAndGivesBackZeroPages) {
  Buffer buf(4);
  ASSERT_NE(buf.at, nullptr);
  auto pool = PagePool::create(2 * kPage);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->bytes(), 2 * kPage);
  ASSERT_TRUE(pool->map(buf.page(0), 2 * kPage));
  std::memset(buf.page(0), 7, 2 * kPage);
  EXPECT_FALSE(pool->map(buf.page(0), kPage));  // (a place mapped already)
  EXPECT_FALSE(pool->map(buf.page(2), kPage));  // exhausted: nothing changes there
  ASSERT_TRUE(pool->unmap(buf.page(0)));
  EXPECT_TRUE(all_are(buf.page(0), 2 * kPage, 0));  // fresh pages read zero
  ASSERT_TRUE(pool->map(buf.page(2), 2 * kPage));   // the same pool pages, elsewhere: what they held
  EXPECT_TRUE(all_are(buf.page(2), 2 * kPage, 7));
  EXPECT_TRUE(pool->unmap(buf.page(2)));
  EXPECT_FALSE(pool->unmap(buf.page(2)));  // nothing mapped there now
  EXPECT_EQ(page_pool_faults().mapped, 2u);
  EXPECT_EQ(page_pool_faults().unmapped, 2u);
}

TEST_F(PagePoolTest, NoMemfdMeansNoPool) {
  page_pool_faults().no_memfd = true;
  EXPECT_EQ(PagePool::create(4 * kPage), nullptr);
  Buffer buf(4);
  EXPECT_EQ(PooledRanges::create({buf.floats(), buf.bytes / sizeof(float)}, 0, 0, 1, buf.bytes), nullptr);
  page_pool_faults().no_memfd = false;
  EXPECT_EQ(PagePool::create(0), nullptr);  // (nothing to pool)
}

TEST_F(PagePoolTest, SmallPoolTakesTheFirstGapThatFits) {
  page_pool_faults().max_bytes = 3 * kPage + 100;  // (whole pages: 3)
  auto pool = PagePool::create(8 * kPage);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->bytes(), 3 * kPage);
  Buffer buf(8);
  ASSERT_TRUE(pool->map(buf.page(0), kPage));
  ASSERT_TRUE(pool->map(buf.page(2), 2 * kPage));
  std::memset(buf.page(2), 3, 2 * kPage);
  EXPECT_FALSE(pool->map(buf.page(5), kPage));  // exhausted
  EXPECT_EQ(page_pool_faults().refused, 1u);
  ASSERT_TRUE(pool->unmap(buf.page(0)));
  EXPECT_FALSE(pool->map(buf.page(5), 2 * kPage));  // one page free: too short a gap
  ASSERT_TRUE(pool->map(buf.page(5), kPage));
  EXPECT_TRUE(all_are(buf.page(2), 2 * kPage, 3));  // the live span kept its pages
  EXPECT_TRUE(pool->unmap(buf.page(2)));
  EXPECT_TRUE(pool->unmap(buf.page(5)));
}

TEST_F(PagePoolTest, FailedMappingChangesNothing) {
  auto pool = PagePool::create(2 * kPage);
  ASSERT_NE(pool, nullptr);
  Buffer buf(2);
  std::memset(buf.at, 5, buf.bytes);
  page_pool_faults().fail_map = true;
  EXPECT_FALSE(pool->map(buf.page(0), 2 * kPage));
  EXPECT_TRUE(all_are(buf.at, buf.bytes, 5));
  EXPECT_FALSE(pool->unmap(buf.page(0)));  // nothing was mapped
  page_pool_faults().fail_map = false;
  EXPECT_TRUE(pool->map(buf.page(0), 2 * kPage));  // the pool's pages are all free still
  EXPECT_TRUE(pool->unmap(buf.page(0)));
}

TEST_F(PagePoolTest, FailedUnmapLeavesTheSpanMappedAndItsPlaceRefused) {
  auto pool = PagePool::create(2 * kPage);
  ASSERT_NE(pool, nullptr);
  Buffer buf(4);
  ASSERT_TRUE(pool->map(buf.page(0), kPage));
  std::memset(buf.page(0), 9, kPage);
  page_pool_faults().fail_unmap = true;
  EXPECT_FALSE(pool->unmap(buf.page(0)));
  EXPECT_EQ(page_pool_faults().stuck, 1u);
  EXPECT_TRUE(all_are(buf.page(0), kPage, 0));   // still the pool's page, zeroed as fresh pages read
  std::memset(buf.page(0), 9, kPage);
  EXPECT_FALSE(pool->map(buf.page(0), kPage));   // that place keeps it
  EXPECT_TRUE(pool->map(buf.page(1), kPage));    // the other pool page
  EXPECT_TRUE(all_are(buf.page(0), kPage, 9));   // (not that one)
  EXPECT_FALSE(pool->map(buf.page(2), kPage));   // and no more: the stuck page is not free
  page_pool_faults().fail_unmap = false;
  EXPECT_TRUE(pool->unmap(buf.page(0)));
  EXPECT_TRUE(pool->unmap(buf.page(1)));
}

// A buffer's range [begin, end) with the shard [lo, hi) inside: only whole pages outside the shard
// are pooled, never a page that holds shard values or lies partly outside the range.
TEST_F(PagePoolTest, RangesNotPageAlignedPoolOnlyTheirWholeOuterPages) {
  Buffer buf(8);
  const size_t per_page = kPage / sizeof(float), n = 8 * per_page;
  const size_t lo = 3 * per_page + 5, hi = 5 * per_page - 3;  // the shard, not aligned
  auto ranges = PooledRanges::create({buf.floats(), n}, lo, hi, 2, 8 * kPage);
  ASSERT_NE(ranges, nullptr);
  const size_t begin = per_page / 2, end = 7 * per_page + 11;  // range 0
  const auto outer = ranges->outer(begin, end);
  EXPECT_EQ(outer[0].first, buf.page(1));  // [begin, lo): pages 1 and 2
  EXPECT_EQ(outer[0].second, 2 * kPage);
  EXPECT_EQ(outer[1].first, buf.page(5));  // [hi, end): pages 5 and 6
  EXPECT_EQ(outer[1].second, 2 * kPage);
  std::fill(buf.floats(), buf.floats() + n, 1.0f);
  const auto mapped = ranges->map(0, begin, end);
  EXPECT_EQ(mapped[0], outer[0]);
  EXPECT_EQ(mapped[1], outer[1]);
  // the pages not pooled keep their values: the range's edges and the shard's pages
  EXPECT_EQ(buf.floats()[begin], 1.0f);
  EXPECT_EQ(buf.floats()[per_page - 1], 1.0f);
  EXPECT_EQ(buf.floats()[lo], 1.0f);
  EXPECT_EQ(buf.floats()[hi - 1], 1.0f);
  EXPECT_EQ(buf.floats()[7 * per_page], 1.0f);
  EXPECT_EQ(buf.floats()[end - 1], 1.0f);
  EXPECT_EQ(buf.floats()[per_page], 0.0f);  // a pooled page: what the pool held (fresh: zero), not the 1s
  EXPECT_EQ(ranges->map(0, begin, end)[0].second, 0u);  // mapped already: nothing new
  // a range with no whole page outside the shard pools nothing
  const auto none = ranges->map(1, per_page + 1, 2 * per_page - 1);
  EXPECT_EQ(none[0].second + none[1].second, 0u);
  ranges->unmap(0);
  EXPECT_EQ(buf.floats()[per_page], 0.0f);  // given back: fresh pages
  EXPECT_EQ(buf.floats()[3 * per_page], 1.0f);
}

// An unmap that fails leaves the span's pool pages in the buffer, zeroed: what a caller that drops the
// range and later accumulates into it (ParamShards' gradients) reads is zero, as from fresh pages, not
// the values the range last held (MADV_DONTNEED does not zero shared pages).
TEST_F(PagePoolTest, StuckSpanReadsZeroLikeFreshPages) {
  Buffer buf(4);
  const size_t per_page = kPage / sizeof(float), n = 4 * per_page;
  auto ranges = PooledRanges::create({buf.floats(), n}, 0, 0, 1, 4 * kPage);
  ASSERT_NE(ranges, nullptr);
  ASSERT_EQ(ranges->map(0, 0, n)[1].second, 4 * kPage);
  std::fill(buf.floats(), buf.floats() + n, 2.0f);
  page_pool_faults().fail_unmap = true;
  ranges->unmap(0);
  EXPECT_EQ(page_pool_faults().stuck, 1u);
  madvise(buf.at, buf.bytes, MADV_DONTNEED);  // (what ParamShards' drop does next)
  EXPECT_TRUE(std::all_of(buf.floats(), buf.floats() + n, [](float x) { return x == 0.0f; }));
  const auto again = ranges->map(0, 0, n);  // still held there: nothing new to map
  EXPECT_EQ(again[0].second + again[1].second, 0u);
  page_pool_faults().fail_unmap = false;
}

}  // namespace
