// Sparse buffers (backend.h: alloc_sparse, map_sparse, unmap_sparse, mapped_ranges) on cpu_fenced:
// nothing mapped at first, mapped pages hold NaN until written, values survive while mapped, an
// op or copy touching an unmapped page dies, the mapped bytes and their peak are counted, and a
// range that is not whole granules is refused. cpu has none.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "troupe/kernels/backend.h"

namespace k = troupe::kernels;

namespace {

const k::Backend& fenced() { return k::cpu_fenced_backend(); }

}  // namespace

TEST(SparseBuffer, CpuHasNone) {
  EXPECT_EQ(k::cpu_backend().sparse_granularity(), 0u);
  const auto buf = k::cpu_backend().alloc_sparse(4096, "a test arena");
  ASSERT_FALSE(buf.ok());
  EXPECT_NE(buf.error().message.find("no sparse buffers (a test arena)"), std::string::npos) << buf.error().message;
  // An ordinary buffer is mapped whole.
  const auto plain = fenced().alloc(100);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(fenced().mapped_ranges(*plain), (std::vector<std::pair<size_t, size_t>>{{0, 100}}));
}

TEST(SparseBuffer, MapsWritesAndGivesBackPages) {
  const size_t g = fenced().sparse_granularity();
  ASSERT_GT(g, 0u);
  const size_t before = fenced().sparse_mapped_bytes();
  auto made = fenced().alloc_sparse(4 * g + 40, "the weights");
  ASSERT_TRUE(made.ok());
  k::Buffer buf = std::move(*made);
  EXPECT_TRUE(fenced().mapped_ranges(buf).empty());
  fenced().reset_sparse_peak();
  ASSERT_TRUE(fenced().map_sparse(buf, g, 2 * g).ok());
  ASSERT_TRUE(fenced().map_sparse(buf, 4 * g, 40).ok());  // the buffer's end closes its last granule
  EXPECT_EQ(fenced().mapped_ranges(buf), (std::vector<std::pair<size_t, size_t>>{{g, 3 * g}, {4 * g, 4 * g + 40}}));
  EXPECT_EQ(fenced().sparse_mapped_bytes(), before + 3 * g);
  const size_t nf = g / sizeof(float);
  float* at = buf.floats() + nf;
  std::vector<float> host(2 * nf);
  fenced().copy_device_to_host(host.data(), at, host.size() * sizeof(float));
  for (float v : host) ASSERT_TRUE(std::isnan(v));  // newly mapped: NaN, so a read before a write shows
  fenced().fill(at, 2 * nf, 3.0f);
  fenced().copy_device_to_host(host.data(), at, host.size() * sizeof(float));
  for (float v : host) ASSERT_EQ(v, 3.0f);
  ASSERT_TRUE(fenced().unmap_sparse(buf, 2 * g, g).ok());
  EXPECT_EQ(fenced().mapped_ranges(buf), (std::vector<std::pair<size_t, size_t>>{{g, 2 * g}, {4 * g, 4 * g + 40}}));
  EXPECT_EQ(fenced().sparse_mapped_bytes(), before + 2 * g);
  EXPECT_EQ(fenced().sparse_mapped_peak(), before + 3 * g);
  fenced().copy_device_to_host(host.data(), at, g);  // the page still mapped kept its values
  for (size_t i = 0; i < nf; ++i) ASSERT_EQ(host[i], 3.0f);
  ASSERT_TRUE(fenced().map_sparse(buf, 2 * g, g).ok());  // mapped again: NaN, not the old values
  fenced().copy_device_to_host(host.data(), at + nf, g);
  EXPECT_TRUE(std::isnan(host[0]));
  buf = k::Buffer();  // freed with what is mapped
  EXPECT_EQ(fenced().sparse_mapped_bytes(), before);
}

TEST(SparseBufferDeathTest, TouchingAnUnmappedPageDies) {
  const size_t g = fenced().sparse_granularity();
  auto buf = fenced().alloc_sparse(2 * g);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(fenced().map_sparse(*buf, 0, g).ok());
  float* second = buf->floats() + g / sizeof(float);
  EXPECT_DEATH(fenced().fill(second, 1, 1.0f), "");
  std::vector<float> host(1);
  EXPECT_DEATH(fenced().copy_device_to_host(host.data(), second, sizeof(float)), "");
  EXPECT_DEATH((void)fenced().map_sparse(*buf, 1, g), "not whole granules");
  auto plain = fenced().alloc(g);
  ASSERT_TRUE(plain.ok());
  EXPECT_DEATH((void)fenced().map_sparse(*plain, 0, g), "not a sparse buffer");
}
