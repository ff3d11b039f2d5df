// Scheduler: the run queue, the worker pool, a cell's turn and the deterministic mode (see scheduler.h).
#include "scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>

#include "troupe/base/clock.h"

namespace troupe::runtime {

namespace {
constexpr std::size_t kBatch = 64;  // a worker's batch buffer, reserved once
// Polling before a consumer gives up its turn, or an idle worker sleeps: adaptive, in time
// between these bounds. Polling that finds work grows the budget (mail comes in quick
// succession: a sleep and wake-up per message would dominate its cost); polling that comes up
// empty halves it (large messages, slow producers: the polling would only take CPU from the
// threads that produce the work). The floor still covers the gaps of a fast stream, which a
// sleep per message would slow down further (and so keep in that mode).
constexpr std::int64_t kSpinMinNs = 1'000;
constexpr std::int64_t kSpinMaxNs = 60'000;
constexpr std::int64_t kSpinStartNs = 20'000;
inline std::int64_t spin_grown(std::int64_t budget) { return std::min(kSpinMaxNs, budget + budget / 2); }
inline std::int64_t spin_shrunk(std::int64_t budget) { return std::max(kSpinMinNs, budget / 2); }
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}
}  // namespace

void Scheduler::start(int threads) {
  for (int i = 0; i < threads; ++i)
    workers_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "troupe-worker");
      worker_loop();
    });
}

void Scheduler::enqueue(ActorCell* c) {
  if (manual_) {
    std::lock_guard lock(runq_mu_);
    runq_.push_back(c);
    runq_size_ = runq_.size();
    return;
  }
  bool wake;
  {
    std::lock_guard lock(runq_mu_);
    runq_.push_back(c);
    runq_size_ = runq_.size();
    wake = idle_workers_ > 0;
  }
  if (wake) runq_cv_.notify_one();
}

void Scheduler::post(ActorCell* c, std::function<void(Context&)> fn) {
  if (post_task(c, std::move(fn))) enqueue(c);
}

bool Scheduler::post_task(ActorCell* c, std::function<void(Context&)> fn) {
  Mail m;
  m.header.recipient = c->id;
  m.task = make_task(std::move(fn));
  auto r = c->mailbox.push_within(std::move(m), Overflow::fail, Duration{0});  // tasks are never refused for room
  return r.ok() && r.value();
}

ActorCell* Scheduler::pop_runnable_blocking() {
  // Spin briefly before sleeping: a futex wake per message would dominate small-message cost.
  thread_local std::int64_t budget = kSpinStartNs;
  const std::int64_t until = mono_nanoseconds() + budget;
  for (int spin = 0;; ++spin) {
    if ((spin & 15) == 15 && mono_nanoseconds() >= until) break;
    if (others_waiting() || stopping_) {
      std::lock_guard lock(runq_mu_);
      if (!runq_.empty()) {
        ActorCell* c = runq_.front();
        runq_.pop_front();
        runq_size_ = runq_.size();
        budget = spin_grown(budget);
        return c;
      }
      if (stopping_) return nullptr;
    }
    cpu_relax();  // no sched_yield: on a busy box it hands the core to threads we then wait for
  }
  budget = spin_shrunk(budget);
  std::unique_lock lock(runq_mu_);
  ++idle_workers_;
  runq_cv_.wait(lock, [&] { return stopping_ || !runq_.empty(); });
  --idle_workers_;
  if (runq_.empty()) return nullptr;
  ActorCell* c = runq_.front();
  runq_.pop_front();
  runq_size_ = runq_.size();
  return c;
}

void Scheduler::worker_loop() {
  std::vector<Mail> batch;
  batch.reserve(kBatch);
  while (ActorCell* c = pop_runnable_blocking()) {
    busy_.fetch_add(1);
    turn(c, batch, /*spin=*/true);
    busy_.fetch_sub(1);
  }
}

void Scheduler::turn_inline(ActorCell* c, std::vector<Mail>& batch) {
  busy_.fetch_add(1);
  turn(c, batch, /*spin=*/false, /*max_batches=*/1);
  busy_.fetch_sub(1);
}

void Scheduler::turn(ActorCell* c, std::vector<Mail>& batch, bool spin, int max_batches) {
  CellState s = c->state.load();
  if (s == CellState::restarting) {
    c->state = CellState::running;
    handler_.restart(*c);
    if (c->fail_requested) {
      handler_.crashed(*c);
      return;
    }
  } else if (s != CellState::running) {
    c->mailbox.unschedule();
    if (s == CellState::stopped) {
      for (auto& m : c->mailbox.drain_all()) handler_.reject(*c, m);
    }
    return;
  }
  // Keep the turn while mail keeps coming (spinning briefly when the mailbox runs dry), so a
  // streaming sender does not pay a run-queue hand-off per message; yield when others wait.
  for (int turn = 0;; ++turn) {
    batch.clear();
    std::size_t n = c->mailbox.pop_batch(batch);
    if (n == 0) {
      bool more = false;
      if (!manual_ && spin) {
        bool cut_short = false;
        const std::int64_t until = mono_nanoseconds() + c->spin_budget;
        for (int s = 0;; ++s) {
          if (c->mailbox.has_mail()) {
            more = true;
            break;
          }
          if (others_waiting()) {
            cut_short = true;
            break;
          }
          if ((s & 15) == 15 && mono_nanoseconds() >= until) break;
          // a few pauses between looks: each look pulls the line the producer writes on every push
          cpu_relax();
          cpu_relax();
          cpu_relax();
          cpu_relax();
        }
        if (more)
          c->spin_budget = spin_grown(c->spin_budget);
        else if (!cut_short)  // the mail was late
          c->spin_budget = spin_shrunk(c->spin_budget);
      }
      if (more) continue;
      if (c->mailbox.finish_batch()) continue;  // mail raced in: still scheduled
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      handler_.run(*c, batch[i]);
      if (c->fail_requested) {
        c->mailbox.requeue_front(batch, i + 1);
        batch.clear();
        handler_.after_batch();
        handler_.crashed(*c);
        return;
      }
      if (c->stop_requested) {
        for (std::size_t j = i + 1; j < n; ++j) handler_.reject(*c, batch[j]);
        batch.clear();
        handler_.after_batch();
        handler_.stopped(*c);
        return;
      }
    }
    batch.clear();
    handler_.after_batch();
    if (max_batches && turn + 1 >= max_batches) {  // the rest, if any, is the workers' to run
      if (c->mailbox.finish_batch()) enqueue(c);
      return;
    }
    if (turn >= 16 && others_waiting()) {  // fairness: still scheduled, go to the back of the queue
      enqueue(c);
      return;
    }
  }
}

std::size_t Scheduler::run_until_idle() {
  std::size_t ran = 0;
  std::vector<Mail> batch;
  for (;;) {
    ActorCell* c;
    {
      std::lock_guard lock(runq_mu_);
      if (runq_.empty()) break;
      c = runq_.front();
      runq_.pop_front();
      runq_size_ = runq_.size();
    }
    std::size_t before = c->mailbox.size();
    turn(c, batch, /*spin=*/true);
    ran += 1 + (before > c->mailbox.size() ? before - c->mailbox.size() : 0);
  }
  return ran;
}

void Scheduler::advance(Duration d) {
  run_until_idle();
  Clock::time_point target = timers_.now() + d;
  // Fire timers in deadline order, running the mail each produces before the next fires.
  while (auto next = timers_.next_deadline(target)) {
    timers_.set_manual_now(std::max(timers_.now(), *next));
    timers_.fire_due(*next);
    run_until_idle();
  }
  timers_.set_manual_now(target);
  run_until_idle();
}

void Scheduler::drain(Clock::time_point deadline) {
  if (manual_) {
    run_until_idle();
    return;
  }
  while (Clock::now() < deadline) {
    bool idle;
    {
      std::lock_guard lock(runq_mu_);
      idle = runq_.empty() && busy_.load() == 0;
    }
    if (idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Scheduler::stop() {
  stopping_ = true;
  runq_cv_.notify_all();
}

void Scheduler::join() {
  for (auto& w : workers_) w.join();
}

}  // namespace troupe::runtime
