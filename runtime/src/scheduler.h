// Runs the cells that have mail: a run queue drained by a pool of worker threads, or, in
// deterministic mode (threads == 0), by the caller (run_until_idle; advance moves the manual
// clock and fires due timers in deadline order). A cell's turn takes its mail in batches and
// keeps the turn while mail keeps coming (spinning briefly when the mailbox runs dry), so a
// streaming sender pays no run-queue hand-off per message; after 16 batches it yields when other
// cells wait. Invariant: a cell is processed by at most one thread at a time — its mailbox's
// scheduled bit is the lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actor_cell.h"
#include "timer_queue.h"

namespace troupe::runtime {

// What a cell's turn hands off: the calls into the actor's own code (they need a Context, which
// only the actor system makes) and what follows when the actor crashed or asked to stop.
class TurnHandler {
 public:
  virtual void restart(ActorCell& c) = 0;          // rebuild from the factory and run on_start
  virtual void run(ActorCell& c, Mail& m) = 0;     // one handler or task; a throw sets fail_requested
  virtual void reject(ActorCell& c, Mail& m) = 0;  // mail for a stopped actor
  virtual void crashed(ActorCell& c) = 0;          // fail_requested is set
  virtual void stopped(ActorCell& c) = 0;          // stop_requested is set
  virtual void after_batch() = 0;                  // a batch of handlers ran (hand over batched sends)

 protected:
  ~TurnHandler() = default;
};

class Scheduler {
 public:
  Scheduler(bool manual, TimerQueue& timers, TurnHandler& handler)
      : manual_(manual), timers_(timers), handler_(handler) {}

  bool manual() const { return manual_; }
  void start(int threads);

  void enqueue(ActorCell* c);                                 // c's mailbox has just become scheduled
  void post(ActorCell* c, std::function<void(Context&)> fn);  // a task in c's mailbox, past its bound
  // The same without the enqueue: true when the caller must run or enqueue c now.
  bool post_task(ActorCell* c, std::function<void(Context&)> fn);
  // One batch of c's mail on the calling thread (a receive thread, which owns c's scheduled bit),
  // no spinning; mail that arrived meanwhile goes on to the workers.
  void turn_inline(ActorCell* c, std::vector<Mail>& batch);

  // --- deterministic mode ---
  std::size_t run_until_idle();  // items run
  void advance(Duration d);

  // Until no cell is queued or running (deterministic mode: runs them) or the deadline passes.
  void drain(Clock::time_point deadline);
  bool stopping() const { return stopping_; }
  void stop();  // workers end once the run queue is empty
  void join();

 private:
  bool others_waiting() const { return runq_size_.load(std::memory_order_relaxed) != 0; }
  ActorCell* pop_runnable_blocking();
  void worker_loop();
  // max_batches 0 = keep the turn while mail keeps coming (fairness aside)
  void turn(ActorCell* c, std::vector<Mail>& batch, bool spin, int max_batches = 0);

  const bool manual_;
  TimerQueue& timers_;
  TurnHandler& handler_;
  std::mutex runq_mu_;
  std::condition_variable runq_cv_;
  std::deque<ActorCell*> runq_;
  std::atomic<std::size_t> runq_size_{0};
  int idle_workers_ = 0;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> workers_;
  std::atomic<std::int64_t> busy_{0};  // cells being processed right now
};

}  // namespace troupe::runtime
