// The decode pool (decode_pool.h): every index of a job runs exactly once, results equal a serial
// run bit for bit, idle workers block, nested and concurrent use run correctly, and destruction (of
// a pool, or of a thread's own pool when the thread exits) joins the workers.
#include "decode_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

namespace {

using troupe::kernels::DecodePool;
using namespace std::chrono_literals;

// Threads of this process (Linux: /proc/self/task).
int process_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// The thread count once it has settled at `want` (a joined thread leaves /proc a moment after the
// join returns), or what it is after a liveness bound.
int threads_settled_at(int want) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  int n = process_threads();
  while (n != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
    n = process_threads();
  }
  return n;
}

// Runs a job of n indices on `threads` threads and checks that each ran exactly once.
void expect_each_once(DecodePool& pool, int n, int threads) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
  pool.run(n, threads, [&](int i) { runs[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed); });
  for (int i = 0; i < n; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
}

// A value per index that depends on its index alone: a chain of float operations.
float chain(int i) {
  float s = 0.1f * static_cast<float>(i);
  for (int k = 0; k < 200; ++k) s = std::fma(s, 0.999f, std::sin(static_cast<float>(i + k)));
  return s;
}

TEST(DecodePool, EveryIndexRunsExactlyOnce) {
  DecodePool pool;
  for (int threads : {1, 2, 3, 4})
    for (int n : {0, 1, 2, 3, 15, 64, 768, 1001}) expect_each_once(pool, n, threads);
  for (int rep = 0; rep < 2000; ++rep) expect_each_once(pool, 15, 2);  // a decode step's job, back to back
  EXPECT_EQ(pool.workers(), 3);  // threads - 1 of the widest job
}

TEST(DecodePool, ResultsEqualASerialRun) {
  const int n = 997;
  std::vector<float> serial(n), pooled(n, -1.0f);
  for (int i = 0; i < n; ++i) serial[static_cast<size_t>(i)] = chain(i);
  DecodePool pool;
  for (int threads : {2, 3}) {
    pool.run(n, threads, [&](int i) { pooled[static_cast<size_t>(i)] = chain(i); });
    EXPECT_EQ(std::memcmp(serial.data(), pooled.data(), sizeof(float) * n), 0) << threads << " threads";
  }
}

TEST(DecodePool, IdleWorkersBlockAndWakeForTheNextJob) {
  DecodePool pool(200us);
  expect_each_once(pool, 64, 3);
  ASSERT_EQ(pool.workers(), 2);
  const auto deadline = std::chrono::steady_clock::now() + 10s;  // liveness bound only
  while (pool.blocked_workers() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(pool.blocked_workers(), 2) << "workers still spinning long after their spin bound";
  for (int rep = 0; rep < 50; ++rep) {
    expect_each_once(pool, 64, 3);
    if (rep % 10 == 0) std::this_thread::sleep_for(2ms);  // past the spin: a job must wake them
  }
  DecodePool no_spin(0us);  // blocks at once after every job
  for (int rep = 0; rep < 200; ++rep) expect_each_once(no_spin, 7, 2);
}

TEST(DecodePool, NestedJobsRunOnTheirCaller) {
  DecodePool pool;
  const int outer = 12, inner = 9;
  std::vector<std::atomic<int>> runs(static_cast<size_t>(outer * inner));
  pool.run(outer, 3, [&](int i) {
    auto mark = [&](int j) { runs[static_cast<size_t>(i * inner + j)].fetch_add(1); };
    if (i % 2 == 0)
      pool.run(inner, 3, mark);  // the same pool, from the caller or a worker
    else
      troupe::kernels::decode_pool().run(inner, 3, mark);  // the running thread's own pool
  });
  for (size_t k = 0; k < runs.size(); ++k) ASSERT_EQ(runs[k].load(), 1) << "index " << k;
}

TEST(DecodePool, ConcurrentCallersOfOnePoolEachGetEveryIndex) {
  DecodePool pool;
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 300; ++rep) {
        const int n = 5 + (rep + c) % 40;
        std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
        pool.run(n, 2 + c % 2, [&](int i) { runs[static_cast<size_t>(i)].fetch_add(1); });
        for (auto& r : runs) failures += r.load() != 1;
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(DecodePool, DestructionJoinsTheWorkers) {
  const int before = process_threads();
  {
    DecodePool pool;
    expect_each_once(pool, 32, 4);
    EXPECT_EQ(threads_settled_at(before + 3), before + 3);
  }
  EXPECT_EQ(threads_settled_at(before), before);
  {
    DecodePool pool(0us);  // workers asleep in the kernel when it goes
    expect_each_once(pool, 32, 3);
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(threads_settled_at(before), before);
  // A thread's own pool goes with the thread.
  std::thread t([] { expect_each_once(troupe::kernels::decode_pool(), 40, 3); });
  t.join();
  EXPECT_EQ(threads_settled_at(before), before);
}

}  // namespace
