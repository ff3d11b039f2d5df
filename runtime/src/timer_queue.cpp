// TimerQueue: the deadline-ordered timers, the timer thread and the manual clock (see timer_queue.h).
#include "timer_queue.h"

#include <pthread.h>

namespace troupe::runtime {

Clock::time_point TimerQueue::now() const {
  if (manual_) return Clock::time_point(std::chrono::nanoseconds(manual_now_ns_.load()));
  return Clock::now();
}

void TimerQueue::set_manual_now(Clock::time_point t) {
  if (manual_) manual_now_ns_ = t.time_since_epoch().count();
}

TimerId TimerQueue::add(Clock::time_point when, Duration period, std::function<void()> fn) {
  TimerId id = next_id_.fetch_add(1);
  bool wake;
  {
    std::lock_guard lock(mu_);
    const Key key{when, inserted_++};
    timers_.emplace(key, Entry{id, period, std::move(fn)});
    index_[id] = key;
    live_.insert(id);
    wake = when < wait_until_;  // only wake the timer thread when it would sleep past this one
  }
  if (wake) cv_.notify_one();
  return id;
}

void TimerQueue::remove(TimerId id) {
  std::lock_guard lock(mu_);
  live_.erase(id);
  auto it = index_.find(id);
  if (it == index_.end()) return;
  timers_.erase(it->second);
  index_.erase(it);
}

bool TimerQueue::live(TimerId id) {
  std::lock_guard lock(mu_);
  return live_.count(id) != 0;
}

void TimerQueue::forget(TimerId id) {
  std::lock_guard lock(mu_);
  live_.erase(id);
}

std::optional<Clock::time_point> TimerQueue::next_deadline(Clock::time_point limit) {
  std::lock_guard lock(mu_);
  if (timers_.empty() || timers_.begin()->first.first > limit) return std::nullopt;
  return timers_.begin()->first.first;
}

std::size_t TimerQueue::fire_due(Clock::time_point t) {
  std::size_t fired = 0;
  for (;;) {
    Entry e;
    {
      std::lock_guard lock(mu_);
      if (timers_.empty() || timers_.begin()->first.first > t) break;
      auto it = timers_.begin();
      Clock::time_point when = it->first.first;
      e = std::move(it->second);
      timers_.erase(it);
      if (e.period.count() > 0) {
        Clock::time_point next = when + e.period;
        if (next <= t && !manual_) next = t + e.period;  // fell behind: do not burst
        const Key key{next, inserted_++};
        timers_.emplace(key, Entry{e.id, e.period, e.fn});
        index_[e.id] = key;
      } else {
        index_.erase(e.id);
      }
    }
    ++fired;
    e.fn();
  }
  return fired;
}

void TimerQueue::start_thread() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "troupe-timer");
    loop();
  });
}

void TimerQueue::stop() {
  stopping_ = true;
  cv_.notify_all();
}

void TimerQueue::join() {
  if (thread_.joinable()) thread_.join();
}

void TimerQueue::loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    Clock::time_point cap = Clock::now() + std::chrono::milliseconds(100);
    wait_until_ = timers_.empty() ? cap : std::min(timers_.begin()->first.first, cap);
    if (wait_until_ > Clock::now()) cv_.wait_until(lock, wait_until_);
    wait_until_ = Clock::time_point::min();  // awake: every new timer is seen on the next pass
    if (stopping_) break;
    lock.unlock();
    fire_due(Clock::now());
    lock.lock();
  }
}

}  // namespace troupe::runtime
