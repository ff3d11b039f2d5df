// Tests of the copy engine (FIFO order, waits, never-recorded events, bandwidth limit, injected
// delays) and of ActivationOffload's protocol: a simulated checkpointed step under random copy
// delays reads exactly the offloaded inputs (a missing wait shows as a wrong checksum).
#include "troupe/kernels/offload.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

namespace troupe::kernels {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CopyEngine, FifoOrderAndEvents) {
  std::mt19937 rng(1);
  CopyEngine engine({0, [&](uint64_t i) { return (i % 7) * 2e-4; }});
  std::vector<std::vector<int>> srcs(40, std::vector<int>(1000));
  std::vector<int> dst(1000, -1);
  std::vector<CopyEvent> events;
  for (int i = 0; i < 40; ++i) {
    std::fill(srcs[i].begin(), srcs[i].end(), i);
    events.push_back(engine.copy_async(dst.data(), srcs[i].data(), sizeof(int) * 1000));
  }
  for (int i = 1; i < 40; ++i) EXPECT_LT(events[i - 1].seq, events[i].seq);
  engine.wait(events[20]);
  for (int i = 0; i <= 20; ++i) EXPECT_TRUE(engine.query(events[i])) << "FIFO: earlier copies are done";
  engine.wait(events.back());
  for (int v : dst) ASSERT_EQ(v, 39) << "the last queued copy wins";
  EXPECT_EQ(engine.stats().copies, 40u);
  EXPECT_EQ(engine.stats().bytes, 40u * 1000 * sizeof(int));
}

// A waiting host runs copies the copy thread has not started (FIFO, one at a time): with many
// small copies queued and waited on at once, every copy still lands exactly once, in order, and the
// two kinds of copies add up.
TEST(CopyEngine, WaitingHostRunsPendingCopiesInOrder) {
  CopyEngine engine({0, [](uint64_t i) { return (i % 5 == 0) ? 1e-3 : 0.0; }});
  for (int round = 0; round < 20; ++round) {
    std::vector<std::vector<int>> srcs(30, std::vector<int>(256));
    std::vector<int> dst(256, -1), order;
    std::vector<CopyEvent> events;
    for (int i = 0; i < 30; ++i) {
      std::fill(srcs[i].begin(), srcs[i].end(), round * 100 + i);
      events.push_back(engine.copy_async(dst.data(), srcs[i].data(), sizeof(int) * 256));
    }
    engine.wait(events[14]);
    for (int i = 0; i <= 14; ++i) ASSERT_TRUE(engine.query(events[i])) << "FIFO: earlier copies are done";
    engine.wait(events.back());
    for (int v : dst) ASSERT_EQ(v, round * 100 + 29) << "the last queued copy wins";
  }
  const auto st = engine.stats();
  EXPECT_EQ(st.copies, 600u);
  EXPECT_LE(st.host_copies, st.copies);
}

TEST(CopyEngine, WaitBlocksUntilCopyCompleted) {
  CopyEngine engine({0, [](uint64_t) { return 0.05; }});
  std::vector<float> src(1 << 16, 3.0f), dst(1 << 16, 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  CopyEvent ev = engine.copy_async(dst.data(), src.data(), src.size() * sizeof(float));
  EXPECT_FALSE(engine.query(ev));
  engine.wait(ev);
  EXPECT_GE(seconds_since(t0), 0.045);
  EXPECT_TRUE(engine.query(ev));
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size() * sizeof(float)), 0);
  EXPECT_GT(engine.stats().host_wait_s, 0.0);
}

TEST(CopyEngine, NeverRecordedEventIsComplete) {
  CopyEngine engine;
  CopyEvent never;
  EXPECT_TRUE(engine.query(never));
  engine.wait(never);  // returns at once
  engine.synchronize();  // nothing queued
}

// A reader that does not wait sees stale data under an injected delay: the race tests below can
// therefore catch a missing wait.
TEST(CopyEngine, InjectedDelayExposesMissingWait) {
  CopyEngine engine({0, [](uint64_t) { return 0.1; }});
  std::vector<float> src(1024, 1.0f), dst(1024, 0.0f);
  CopyEvent ev = engine.copy_async(dst.data(), src.data(), src.size() * sizeof(float));
  EXPECT_FALSE(engine.query(ev));
  engine.wait(ev);
  EXPECT_EQ(dst[0], 1.0f);
  EXPECT_EQ(dst[1023], 1.0f);
}

// Lower bound only: a copy of B bytes at bandwidth W takes at least B / W.
TEST(CopyEngine, BandwidthLimit) {
  CopyEngine engine({200e6, nullptr});
  std::vector<char> src(4 << 20, 7), dst(4 << 20, 0);
  const auto t0 = std::chrono::steady_clock::now();
  engine.wait(engine.copy_async(dst.data(), src.data(), src.size()));
  EXPECT_GE(seconds_since(t0), 0.95 * double(src.size()) / 200e6);
  engine.set_bandwidth(0);
  EXPECT_EQ(dst[12345], 7);
}

double checksum(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * double(i % 13 + 1);
  return s;
}

// One simulated checkpointed step per call: forward ping-pongs layer inputs through two arena
// buffers (the input of layer l is overwritten by layer l+2's), offloading each; backward reloads
// them in reverse and checks every byte it reads against what the forward produced.
void simulated_step(ActivationOffload& off, int L, size_t n, int step) {
  std::vector<std::vector<float>> arena(2, std::vector<float>(n));
  std::vector<double> expected(static_cast<size_t>(L));
  auto fill = [&](std::vector<float>& x, int l) {
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 31 + static_cast<size_t>(l) * 7 + step) % 101);
  };
  fill(arena[0], 0);
  for (int l = 0; l < L; ++l) {
    auto& x = arena[static_cast<size_t>(l % 2)];
    expected[static_cast<size_t>(l)] = checksum(x.data(), n);
    if (off.offloaded(l)) {
      ASSERT_TRUE(off.offload_begin(l, x.data(), n).ok());
    }
    if (l + 1 < L) {
      auto& next = arena[static_cast<size_t>((l + 1) % 2)];
      // Layer l+1's input overwrites layer l-1's arena buffer: its offload must be done.
      if (l >= 1 && off.offloaded(l - 1)) {
        ASSERT_TRUE(off.offload_wait(l - 1).ok());
      }
      fill(next, l + 1);
    }
  }
  // The arena buffers get reused by other work right after forward: scribble on them.
  if (L >= 2 && off.offloaded(L - 2)) {
    ASSERT_TRUE(off.offload_wait(L - 2).ok());
  }
  if (off.offloaded(L - 1)) {
    ASSERT_TRUE(off.offload_wait(L - 1).ok());
    for (auto& a : arena) std::fill(a.begin(), a.end(), -1.0f);
  } else {
    // The last layer's input stays in the arena; the other buffer is free.
    std::fill(arena[static_cast<size_t>(L % 2)].begin(), arena[static_cast<size_t>(L % 2)].end(), -1.0f);
  }
  for (int l = L - 1; l >= 0; --l) {
    const float* x = nullptr;
    if (off.offloaded(l)) {
      auto r = off.reload_wait(l);
      ASSERT_TRUE(r.ok()) << r.error().message;
      x = *r;
    } else {
      x = arena[static_cast<size_t>(l % 2)].data();
    }
    if (l >= 1 && off.offloaded(l - 1)) {
      ASSERT_TRUE(off.reload_begin(l - 1).ok());
    }
    EXPECT_EQ(checksum(x, n), expected[static_cast<size_t>(l)]) << "step " << step << " layer " << l;
    if (off.offloaded(l)) {
      ASSERT_TRUE(off.reload_release(l).ok());
    }
  }
}

void run_protocol(bool double_buffer, bool offload_last, int L, double max_delay_s) {
  std::mt19937 rng(static_cast<unsigned>(L * 10 + double_buffer));
  std::uniform_real_distribution<double> u(0.0, max_delay_s);
  std::vector<double> delays(4096);
  for (auto& d : delays) d = u(rng);
  CopyEngine engine({0, [delays](uint64_t i) { return delays[i % delays.size()]; }});
  const size_t n = 20000;
  auto off = ActivationOffload::create(engine, {L, n, double_buffer, offload_last});
  ASSERT_TRUE(off.ok());
  for (int step = 0; step < 3; ++step) simulated_step(**off, L, n, step);
  const int offloaded = offload_last ? L : L - 1;
  EXPECT_EQ((*off)->sync_reloads() + (*off)->overlapped_reloads(), 3 * offloaded);
  if (double_buffer) {
    // Every reload but the first of each step was started early.
    EXPECT_EQ((*off)->sync_reloads(), offloaded > 0 ? 3 * (offload_last ? 1 : 0) : 0);
  } else {
    // One buffer: only the reload issued during the (not offloaded) last layer's backward finds it free.
    EXPECT_EQ((*off)->overlapped_reloads(), (!offload_last && L >= 2) ? 3 : 0);
  }
}

TEST(Offload, DoubleBufferNoRaceUnderDelays) { run_protocol(true, false, 6, 3e-3); }
TEST(Offload, DoubleBufferOddLayersOffloadLast) { run_protocol(true, true, 5, 3e-3); }
TEST(Offload, SingleBufferNoRaceUnderDelays) { run_protocol(false, false, 6, 3e-3); }
TEST(Offload, SingleBufferOffloadLast) { run_protocol(false, true, 3, 3e-3); }
TEST(Offload, TwoLayers) { run_protocol(true, false, 2, 2e-3); }
TEST(Offload, OneLayer) {
  run_protocol(true, false, 1, 1e-3);  // nothing offloaded: the only layer is the last
  run_protocol(true, true, 1, 1e-3);
  run_protocol(false, true, 1, 1e-3);
}

TEST(Offload, MemoryAccounting) {
  CopyEngine engine;
  auto two = ActivationOffload::create(engine, {4, 1000, true, false});
  auto one = ActivationOffload::create(engine, {4, 1000, false, false});
  ASSERT_TRUE(two.ok() && one.ok());
  EXPECT_EQ((*two)->reload_buffer_bytes(), 2 * 1000 * sizeof(float));
  EXPECT_EQ((*one)->reload_buffer_bytes(), 1000 * sizeof(float));
  EXPECT_EQ((*two)->store_bytes(), 4 * 1000 * sizeof(float));
}

TEST(Offload, ProtocolMisuseIsAnError) {
  CopyEngine engine;
  EXPECT_FALSE(ActivationOffload::create(engine, {0, 10, true, false}).ok());
  EXPECT_FALSE(ActivationOffload::create(engine, {2, 0, true, false}).ok());
  auto r = ActivationOffload::create(engine, {3, 10, true, false});
  ASSERT_TRUE(r.ok());
  auto& off = **r;
  std::vector<float> x(20, 1.0f);
  EXPECT_FALSE(off.offload_begin(5, x.data(), 10).ok());  // out of range
  EXPECT_FALSE(off.offload_begin(2, x.data(), 10).ok());  // last layer not offloaded
  Status big = off.offload_begin(0, x.data(), 20);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("max_floats"), std::string::npos);
  EXPECT_FALSE(off.reload_begin(1).ok());  // not offloaded this step
  EXPECT_FALSE(off.reload_wait(1).ok());
  ASSERT_TRUE(off.offload_begin(0, x.data(), 10).ok());
  ASSERT_TRUE(off.offload_begin(1, x.data(), 10).ok());
  EXPECT_FALSE(off.reload_release(1).ok());  // holds no buffer
  ASSERT_TRUE(off.reload_begin(1).ok());
  EXPECT_FALSE(off.reload_release(1).ok());  // released before wait
  ASSERT_TRUE(off.reload_wait(1).ok());
  EXPECT_FALSE(off.reload_wait(1).ok());     // waited twice
  ASSERT_TRUE(off.reload_begin(0).ok());
  ASSERT_TRUE(off.reload_release(1).ok());
  ASSERT_TRUE(off.reload_wait(0).ok());
  ASSERT_TRUE(off.reload_release(0).ok());
}

TEST(Offload, BothBuffersHeldIsAnError) {
  CopyEngine engine;
  auto r = ActivationOffload::create(engine, {4, 10, true, true});
  ASSERT_TRUE(r.ok());
  auto& off = **r;
  std::vector<float> x(10, 1.0f);
  for (int l = 0; l < 3; ++l) ASSERT_TRUE(off.offload_begin(l, x.data(), 10).ok());
  ASSERT_TRUE(off.reload_wait(2).ok());
  ASSERT_TRUE(off.reload_wait(1).ok());
  Status s = off.reload_begin(0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("layer 0"), std::string::npos);
}

}  // namespace
}  // namespace troupe::kernels
