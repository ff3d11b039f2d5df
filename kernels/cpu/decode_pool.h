// The decode steps' thread pool (internal to kernels/cpu/): what the one- and two-row quantized
// projection chains run their tiles on instead of OpenMP regions. A batch-1 decode step opens about
// four such jobs per layer; OpenMP under troupe's default OMP_WAIT_POLICY=PASSIVE puts its worker to
// sleep after each and pays a futex wake-up for the next, about a third of a token's time. These
// workers spin for a bounded time (kDecodePoolSpin) after a job, then block, whatever
// OMP_WAIT_POLICY says: a token's jobs find them awake, an idle process (or one training with
// OpenMP's threads) finds them asleep.
//
// A job is fn(i) for every i in [0, n), each index run exactly once, by whichever of the calling
// thread and the workers claims it next (so a worker the scheduler has taken away never holds up
// indices it has not claimed). What an index computes must not depend on the thread that runs it;
// then the results are those of the serial loop, bit for bit.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::kernels {

// How long an idle worker spins for the next job before it blocks: longer than the gaps between a
// decode step's jobs (its norms, attention, sampling: tens of microseconds on SmolLM2-135M), far
// shorter than the time between two generations.
inline constexpr std::chrono::microseconds kDecodePoolSpin{300};

class DecodePool {
 public:
  explicit DecodePool(std::chrono::microseconds spin = kDecodePoolSpin);
  ~DecodePool();  // wakes and joins the workers; no job may be running
  DecodePool(const DecodePool&) = delete;
  DecodePool& operator=(const DecodePool&) = delete;

  // fn(i) once for every i in [0, n) on at most `threads` threads: the caller and up to threads - 1
  // workers (started on first need, kept). Returns when every index has run. Runs the loop on the
  // caller alone when threads <= 1, from inside a job (nested), or while another thread's job holds
  // the pool (concurrent use), so it is safe from any thread.
  template <class Fn>
  void run(int n, int threads, const Fn& fn) {
    run_job(n, threads, [](const void* f, int i) { (*static_cast<const Fn*>(f))(i); }, &fn);
  }

  int workers() const;          // workers started so far
  int blocked_workers() const;  // of them, those asleep in the kernel (not spinning, not working)

 private:
  using Body = void (*)(const void*, int);
  void run_job(int n, int threads, Body body, const void* ctx);
  void start_workers(int n);
  void work(uint32_t seen);
  uint32_t next_job(uint32_t seen);
  void claim_all();

  const std::chrono::microseconds spin_;
  std::mutex owner_;  // held by the thread whose job runs
  std::vector<std::thread> threads_;
  // The job: written by its caller before the epoch opens it, read by workers only while it is open.
  Body body_ = nullptr;
  const void* ctx_ = nullptr;
  int n_ = 0, grain_ = 1;
  std::atomic<int> next_{0};      // the next unclaimed index
  std::atomic<int> seats_{0};     // workers that may still join (threads - 1 at the start)
  std::atomic<uint32_t> epoch_{0};  // odd: a job is open; even: none (a worker joins only an open one)
  std::atomic<int> active_{0};    // workers inside the current job
  std::atomic<int> sleeping_{0};  // workers blocked on epoch_
  std::atomic<int> started_{0};
  std::atomic<bool> stop_{false};
};

// The calling thread's pool (each thread that decodes gets its own workers, as each thread that
// opens an OpenMP region gets its own team); destroyed, its workers joined, when the thread exits.
DecodePool& decode_pool();

}  // namespace troupe::kernels
