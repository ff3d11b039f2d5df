// Bounded mailbox: a mutex-guarded deque plus the owner's "scheduled" bit, so that the push
// that finds the owner idle is the one that schedules it (exactly once).
#include "troupe/runtime/mailbox.h"

namespace troupe::runtime {

Result<bool> Mailbox::push(Mail&& m, Overflow policy, std::chrono::steady_clock::time_point deadline) {
  return push_impl(std::move(m), policy, [deadline] { return deadline; });
}

Result<bool> Mailbox::push_within(Mail&& m, Overflow policy, std::chrono::nanoseconds wait) {
  return push_impl(std::move(m), policy, [wait] { return std::chrono::steady_clock::now() + wait; });
}

template <class Deadline>
Result<bool> Mailbox::push_impl(Mail&& m, Overflow policy, Deadline deadline) {
  std::unique_lock lock(mu_);
  if (closed_) return make_error(ErrorCode::peer_failed, "mailbox closed (actor stopped)");
  if (!m.task) {
    if (user_count_ >= capacity_) {
      if (policy == Overflow::fail)
        return make_error(ErrorCode::timeout, "mailbox full (capacity " + std::to_string(capacity_) + ")");
      ++waiters_;
      bool room = not_full_.wait_until(lock, deadline(), [&] { return closed_ || user_count_ < capacity_; });
      --waiters_;
      if (closed_) return make_error(ErrorCode::peer_failed, "mailbox closed (actor stopped)");
      if (!room)
        return make_error(ErrorCode::timeout, "mailbox full (capacity " + std::to_string(capacity_) +
                                                  ") until the send deadline: receiver too slow");
    }
    ++user_count_;
    if (user_count_ > high_water_) high_water_ = user_count_;
  }
  q_.push_back(std::move(m));
  approx_size_.store(q_.size(), std::memory_order_relaxed);
  if (!scheduled_) {
    scheduled_ = true;
    return true;
  }
  return false;
}

std::size_t Mailbox::pop_batch(std::vector<Mail>& out) {
  std::lock_guard lock(mu_);
  out.swap(q_);
  approx_size_.store(0, std::memory_order_relaxed);
  bool had_users = user_count_ != 0;
  user_count_ = 0;
  if (had_users && waiters_) not_full_.notify_all();
  return out.size();
}

bool Mailbox::finish_batch() {
  std::lock_guard lock(mu_);
  if (q_.empty()) {
    scheduled_ = false;
    return false;
  }
  return true;
}

void Mailbox::requeue_front(std::vector<Mail>& items, std::size_t from) {
  std::lock_guard lock(mu_);
  std::size_t users = 0;
  for (std::size_t i = from; i < items.size(); ++i) users += items[i].task ? 0 : 1;
  q_.insert(q_.begin(), std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(from)), std::make_move_iterator(items.end()));
  user_count_ += users;
  approx_size_.store(q_.size(), std::memory_order_relaxed);
}

void Mailbox::unschedule() {
  std::lock_guard lock(mu_);
  scheduled_ = false;
}

bool Mailbox::reschedule_if_pending() {
  std::lock_guard lock(mu_);
  if (scheduled_) return false;
  scheduled_ = true;
  return true;
}

std::vector<Mail> Mailbox::drain_all() {
  std::lock_guard lock(mu_);
  std::vector<Mail> out;
  out.swap(q_);
  user_count_ = 0;
  approx_size_.store(0, std::memory_order_relaxed);
  if (waiters_) not_full_.notify_all();
  return out;
}

void Mailbox::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  not_full_.notify_all();
}

std::size_t Mailbox::size() const {
  std::lock_guard lock(mu_);
  return user_count_;
}

std::size_t Mailbox::high_water() const {
  std::lock_guard lock(mu_);
  return high_water_;
}

}  // namespace troupe::runtime
