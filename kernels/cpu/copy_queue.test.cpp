// The backends' pinned host memory and copy queue (backend.h: alloc_host, copy_to_host_async,
// wait_copy, order_after_copy) and the scale op: cpu copies at once; cpu_fenced takes the copy at
// the call, fences the pages it lands in until wait_copy, and aborts when an op writes the source
// of a copy nothing was ordered after -- the ordering a GPU's copy stream needs, checked here.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <vector>

#include "troupe/kernels/backend.h"

namespace k = troupe::kernels;

namespace {

std::vector<float> iota(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

// A device buffer of n floats holding `values`.
k::Buffer device_with(const k::Backend& be, const std::vector<float>& values) {
  auto buf = be.alloc(values.size() * sizeof(float));
  EXPECT_TRUE(buf.ok());
  be.copy_host_to_device(buf->data(), values.data(), values.size() * sizeof(float));
  return std::move(*buf);
}

size_t page_floats() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)) / sizeof(float); }

}  // namespace

TEST(CopyQueue, HostBuffersAreZeroFilledAndEmptyIsFine) {
  for (const k::Backend* be : {&k::cpu_backend(), &k::cpu_fenced_backend()}) {
    auto h = be->alloc_host(1000 * sizeof(float), "a test mirror");
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->num_floats(), 1000u);
    EXPECT_EQ(h->backend(), be);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(h->floats()[i], 0.0f);
    auto empty = be->alloc_host(0);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(empty->data(), nullptr);
    be->wait_copy(k::CopyTicket{});  // no copy: nothing to wait for or order
    be->order_after_copy(k::CopyTicket{});
  }
}

// The copy holds what the ops before it wrote, not what the ops after it (ordered after) write.
TEST(CopyQueue, ACopyHoldsTheValuesAtItsCallOnEveryBackend) {
  const size_t n = 3 * page_floats() + 5;
  for (const k::Backend* be : {&k::cpu_backend(), &k::cpu_fenced_backend()}) {
    k::Buffer d = device_with(*be, iota(n, 1));
    be->fill(d.floats(), 10, -1.0f);  // an op before the copy: the copy sees it
    auto h = be->alloc_host(n * sizeof(float));
    ASSERT_TRUE(h.ok());
    const k::CopyTicket t = be->copy_to_host_async(h->data(), d.data(), n * sizeof(float));
    EXPECT_TRUE(t);
    be->order_after_copy(t);
    be->fill(d.floats(), n, 7.0f);  // after the copy, ordered after it: the copy does not see it
    be->wait_copy(t);
    const std::vector<float> want = iota(n, 1);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(h->floats()[i], i < 10 ? -1.0f : want[i]) << be->name() << " " << i;
    be->wait_copy(t);  // waiting twice is fine
  }
}

// Copies land in order: waiting for the last lands them all; pieces land one by one and the
// host may read a landed piece while the next is still in flight.
TEST(CopyQueue, PiecesLandInOrder) {
  const k::Backend& be = k::cpu_fenced_backend();
  const size_t piece = page_floats(), n = 3 * piece;
  k::Buffer d = device_with(be, iota(n, 0));
  auto h = be.alloc_host(n * sizeof(float));
  ASSERT_TRUE(h.ok());
  std::vector<k::CopyTicket> t;
  for (size_t b = 0; b < n; b += piece)
    t.push_back(be.copy_to_host_async(h->floats() + b, d.floats() + b, piece * sizeof(float)));
  be.wait_copy(t[0]);
  for (size_t i = 0; i < piece; ++i) ASSERT_EQ(h->floats()[i], static_cast<float>(i));
  be.wait_copy(t[2]);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(h->floats()[i], static_cast<float>(i));
}

TEST(CopyQueueDeathTest, ReadingTheHostBufferBeforeTheCopyLandedFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const k::Backend& be = k::cpu_fenced_backend();
  const size_t n = 2 * page_floats();
  EXPECT_DEATH(
      {
        k::Buffer d = device_with(be, iota(n, 1));
        auto h = be.alloc_host(n * sizeof(float));
        (void)be.copy_to_host_async(h->data(), d.data(), n * sizeof(float));
        std::fprintf(stderr, "copy queued\n");
        volatile float x = h->floats()[3];  // before wait_copy: the page is fenced
        (void)x;
        std::fprintf(stderr, "read\n");
      },
      "copy queued\n$");
  // A landed piece is readable while the next one is still fenced.
  EXPECT_DEATH(
      {
        k::Buffer d = device_with(be, iota(n, 1));
        auto h = be.alloc_host(n * sizeof(float));
        const size_t half = n / 2;
        const k::CopyTicket t0 = be.copy_to_host_async(h->data(), d.data(), half * sizeof(float));
        (void)be.copy_to_host_async(h->floats() + half, d.floats() + half, half * sizeof(float));
        be.wait_copy(t0);
        volatile float ok = h->floats()[half - 1];
        (void)ok;
        std::fprintf(stderr, "first piece read\n");
        volatile float x = h->floats()[half];
        (void)x;
        std::fprintf(stderr, "second piece read\n");
      },
      "first piece read\n$");
}

TEST(CopyQueueDeathTest, WritingTheSourceOfAnUnorderedCopyAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const k::Backend& be = k::cpu_fenced_backend();
  const size_t n = 64;
  EXPECT_DEATH(
      {
        k::Buffer d = device_with(be, iota(n, 1));
        auto h = be.alloc_host(n * sizeof(float));
        (void)be.copy_to_host_async(h->data(), d.data(), n * sizeof(float));
        be.fill(d.floats() + 8, 4, 0.0f);  // an optimizer step's write, unordered
      },
      "fill: pointer .* writes the source of a copy to the host still in flight");
  const auto unordered_adamw = [&] {
    k::Buffer d = device_with(be, iota(n, 1));
    k::Buffer dg = device_with(be, std::vector<float>(n, 1.0f));
    k::Buffer m = device_with(be, std::vector<float>(n));
    k::Buffer v = device_with(be, std::vector<float>(n));
    auto h = be.alloc_host(n * sizeof(float));
    (void)be.copy_to_host_async(h->data(), d.data(), n * sizeof(float));
    be.adamw_update(d.floats(), dg.floats(), m.floats(), v.floats(), n,
                    k::adamw_step_scalars(0.9f, 0.999f, 1e-3, 0.0f, 1e-8f, 1), nullptr);
  };
  EXPECT_DEATH(unordered_adamw(), "adamw_update: pointer .* writes the source of a copy");
  // Writes elsewhere, and writes after order_after_copy or wait_copy, are fine.
  k::Buffer d = device_with(be, iota(n, 1)), other = device_with(be, iota(n, 1));
  auto h = be.alloc_host(n * sizeof(float));
  ASSERT_TRUE(h.ok());
  k::CopyTicket t = be.copy_to_host_async(h->data(), d.data(), n * sizeof(float));
  be.fill(other.floats(), n, 2.0f);
  be.order_after_copy(t);
  be.fill(d.floats(), n, 3.0f);
  t = be.copy_to_host_async(h->data(), d.data(), n * sizeof(float));
  be.wait_copy(t);
  be.fill(d.floats(), n, 4.0f);
  EXPECT_EQ(h->floats()[5], 3.0f);
}

TEST(CopyQueueDeathTest, TheDestinationMustBeAHostBuffer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const k::Backend& be = k::cpu_fenced_backend();
  EXPECT_DEATH(
      {
        k::Buffer d = device_with(be, iota(16, 1));
        std::vector<float> pageable(16);
        (void)be.copy_to_host_async(pageable.data(), d.data(), 16 * sizeof(float));
      },
      "copy_to_host_async: pointer .* is not inside a HostBuffer of this backend");
}

TEST(CopyQueue, FreeingAHostBufferDropsItsCopies) {
  const k::Backend& be = k::cpu_fenced_backend();
  k::Buffer d = device_with(be, iota(16, 1));
  k::CopyTicket t;
  {
    auto h = be.alloc_host(16 * sizeof(float));
    ASSERT_TRUE(h.ok());
    t = be.copy_to_host_async(h->data(), d.data(), 16 * sizeof(float));
  }
  be.wait_copy(t);           // nothing left to land
  be.fill(d.floats(), 16, 0.0f);  // and nothing reads the source any more
}

// scale: each float(double(x) * s), the host loop a streamed step ran, on both CPU backends.
TEST(CopyQueue, ScaleIsTheHostLoopBitForBit) {
  const size_t n = 1001;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.37f * static_cast<float>(i) - 91.0f + 1e-3f * static_cast<float>(i % 7);
  const double s = 1.0 / 977.0;
  std::vector<float> want = x;
  for (float& g : want) g = static_cast<float>(g * s);
  std::vector<float> cpu = x;
  k::cpu_backend().scale(cpu.data(), n, s);
  EXPECT_EQ(cpu, want);
  const k::Backend& be = k::cpu_fenced_backend();
  k::Buffer d = device_with(be, x);
  be.scale(d.floats(), n, s);
  std::vector<float> got(n);
  be.copy_device_to_host(got.data(), d.data(), n * sizeof(float));
  EXPECT_EQ(got, want);
}
