// Timers in deadline order, one-shot or periodic, and the node's clock. With threads, a timer
// thread fires them as they fall due (waking early only for a timer due before its sleep ends);
// in deterministic mode the clock is manual and ActorSystem::advance fires them (Scheduler).
// Callbacks run on the firing thread and only hand work on (post a task, declare a node down).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "troupe/runtime/system.h"

namespace troupe::runtime {

// "N ms", for messages.
inline std::string ms_text(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

class TimerQueue {
 public:
  explicit TimerQueue(bool manual_clock) : manual_(manual_clock) {}

  Clock::time_point now() const;
  void set_manual_now(Clock::time_point t);  // deterministic mode only; ignored otherwise

  // period 0 = one shot. The id stays live (see live()) until remove() or forget().
  TimerId add(Clock::time_point when, Duration period, std::function<void()> fn);
  void remove(TimerId id);
  bool live(TimerId id);
  void forget(TimerId id);  // a one-shot timer's work has run: no longer live

  std::optional<Clock::time_point> next_deadline(Clock::time_point limit);  // the earliest, if <= limit
  std::size_t fire_due(Clock::time_point t);  // fires every timer due at t; returns how many

  void start_thread();
  void stop();  // the timer thread ends at its next wake-up
  void join();

 private:
  struct Entry {
    TimerId id = 0;
    Duration period{0};
    std::function<void()> fn;
  };
  void loop();

  const bool manual_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Ordered by deadline, then by insertion (a sequence number), so timers due together fire in
  // the order they were set and one is found by its key without scanning its equals (in
  // deterministic mode a fan-out's request timeouts all share one deadline).
  using Key = std::pair<Clock::time_point, std::uint64_t>;
  std::map<Key, Entry> timers_;
  std::unordered_map<TimerId, Key> index_;
  std::uint64_t inserted_ = 0;
  std::unordered_set<TimerId> live_;
  std::atomic<TimerId> next_id_{1};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  Clock::time_point wait_until_ = Clock::time_point::min();  // what the timer thread sleeps until
  std::atomic<std::int64_t> manual_now_ns_{3600'000'000'000};
};

}  // namespace troupe::runtime
