// The decode pool (decode_pool.h). A job is published by opening the epoch (an odd value) after its
// fields are written; a worker joins only if, after counting itself in `active_`, the epoch still
// names that job, and the caller closes the epoch (the next even value) before it waits for
// `active_` to drain. Both sides' steps are sequentially consistent, so either the worker sees the
// job closed and leaves without touching it, or the caller sees the worker and waits for it: no
// worker ever reads a job's fields while its caller rewrites them for the next one.
#include "decode_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace troupe::kernels {
namespace {

// True on a pool's workers, and on a caller while it runs its share: a job body that asks a pool
// for a job runs it alone (nested jobs would oversubscribe the cores).
thread_local bool inside_job = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

DecodePool::DecodePool(std::chrono::microseconds spin) : spin_(spin) {}

DecodePool::~DecodePool() {
  stop_.store(true, std::memory_order_seq_cst);
  epoch_.fetch_add(2, std::memory_order_seq_cst);  // stays even: no job, but every waiter sees a change
  epoch_.notify_all();
  for (std::thread& t : threads_) t.join();
}

int DecodePool::workers() const { return started_.load(std::memory_order_acquire); }
int DecodePool::blocked_workers() const { return sleeping_.load(std::memory_order_acquire); }

void DecodePool::start_workers(int n) {
  while (static_cast<int>(threads_.size()) < n) {
    threads_.emplace_back(&DecodePool::work, this, epoch_.load(std::memory_order_relaxed));
    started_.fetch_add(1, std::memory_order_release);
  }
}

void DecodePool::claim_all() {
  for (;;) {
    const int i0 = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (i0 >= n_) return;
    const int i1 = std::min(n_, i0 + grain_);
    for (int i = i0; i < i1; ++i) body_(ctx_, i);
  }
}

void DecodePool::run_job(int n, int threads, Body body, const void* ctx) {
  if (n <= 0) return;
  const int helpers = std::min(threads, n) - 1;
  std::unique_lock<std::mutex> own(owner_, std::defer_lock);
  if (helpers <= 0 || inside_job || !own.try_lock()) {
    for (int i = 0; i < n; ++i) body(ctx, i);
    return;
  }
  start_workers(helpers);
  body_ = body;
  ctx_ = ctx;
  n_ = n;
  grain_ = std::max(1, n / ((helpers + 1) * 8));  // a few claims per thread: cheap, and balanced under load
  next_.store(0, std::memory_order_relaxed);
  seats_.store(helpers, std::memory_order_relaxed);
  const uint32_t open = epoch_.load(std::memory_order_relaxed) + 1;
  epoch_.store(open, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
  inside_job = true;
  claim_all();
  inside_job = false;
  epoch_.store(open + 1, std::memory_order_seq_cst);
  for (unsigned i = 1; active_.load(std::memory_order_seq_cst) != 0; ++i) {
    cpu_relax();
    if (i > 4096) std::this_thread::yield();  // a worker holding an index lost its core
  }
}

// The epoch of the next job after `seen` (or any epoch once stopping): spin for spin_, then block.
uint32_t DecodePool::next_job(uint32_t seen) {
  auto fresh = [seen](uint32_t e) { return (e & 1u) != 0 && e != seen; };
  const auto until = std::chrono::steady_clock::now() + spin_;
  for (unsigned i = 1;; ++i) {
    const uint32_t e = epoch_.load(std::memory_order_acquire);
    if (fresh(e) || stop_.load(std::memory_order_relaxed)) return e;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
  }
  for (;;) {
    sleeping_.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t e = epoch_.load(std::memory_order_seq_cst);
    if (!fresh(e) && !stop_.load(std::memory_order_seq_cst)) epoch_.wait(e, std::memory_order_seq_cst);
    sleeping_.fetch_sub(1, std::memory_order_seq_cst);
    const uint32_t now = epoch_.load(std::memory_order_acquire);
    if (fresh(now) || stop_.load(std::memory_order_acquire)) return now;
  }
}

void DecodePool::work(uint32_t seen) {
  inside_job = true;
  for (;;) {
    const uint32_t e = next_job(seen);
    if (stop_.load(std::memory_order_acquire)) return;
    seen = e;
    active_.fetch_add(1, std::memory_order_seq_cst);
    if (epoch_.load(std::memory_order_seq_cst) == e && seats_.fetch_sub(1, std::memory_order_relaxed) > 0) claim_all();
    active_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

DecodePool& decode_pool() {
  thread_local DecodePool pool;
  return pool;
}

}  // namespace troupe::kernels
